"""Whole torch.distributed training programs, unchanged, on 4 Gloo ranks: each runs under torch
(torch's launcher) and under holoflow (holoflow's launcher, mock_torch), and every rank's answers
must be torch's. The harness (HEADER, FOOTER, _run, _compare) is test_dtensor_api.py's."""
import numpy as np
import pytest
from test_dtensor_api import _compare, _run

# A Llama-style decoder (RMSNorm, rotary embeddings as complex numbers, SwiGLU, causal SDPA, a
# vocabulary of 67 that 2 tensor-parallel ranks split 34/33, then FSDP 17/17 and 17/16) trained as
# torch's "FSDP + TP" recipe on a 2x2 (dp, tp) mesh: tensor parallelism with sequence-parallel
# norms and a loss-parallel head inside each "dp" row, FSDP2 over "dp", AdamW and torchtitan's
# gradient clipping over the 2-D DTensor gradients; full state dicts of the model and optimizer.
# (The parameters' placements are not compared: torch's lie on (dp, tp) with a _StridedShard,
# holoflow's on (tp, dp), the same pieces; their local shapes are.)
LLAMA_2D = '''
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor.parallel import loss_parallel
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
VOCAB, DIM, HEADS, HIDDEN, SEQ, LAYERS = 67, 16, 4, 32, 8, 2


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x, freqs_cis):   # x: (batch, seq, heads, head_dim), pairs rotated as complex numbers
    z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * freqs_cis).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads, self.head_dim = HEADS, DIM // HEADS
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        q = rotary(self.wq(x).view(b, s, -1, self.head_dim), freqs_cis)
        k = rotary(self.wk(x).view(b, s, -1, self.head_dim), freqs_cis)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        freqs = 1.0 / (10000 ** (torch.arange(0, DIM // HEADS, 2).float() / (DIM // HEADS)))
        angles = torch.outer(torch.arange(SEQ).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles)[None, :, None, :],
                             persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


torch.manual_seed(0)
model = Llama()
parallelize_module(model, tp_mesh, {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "output": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
})
for block in model.layers:
    block.attention.n_heads //= tp_mesh.size()
    parallelize_module(block, tp_mesh, {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    })
    fully_shard(block, mesh=dp_mesh)
fully_shard(model, mesh=dp_mesh)
OUT["local_shapes"] = {k: list(p.to_local().shape) for k, p in model.named_parameters()}
OUT["meshes"] = {k: list(p.device_mesh.shape) for k, p in model.named_parameters()}
opt = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
gen = torch.Generator().manual_seed(100 + mesh.get_local_rank("dp"))   # each "dp" row its own batches
losses, norms = [], []
for step in range(3):
    tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=gen)
    opt.zero_grad()
    with loss_parallel():
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(0, 1))
        loss.backward()
    # (torchtitan's clipping: the total norm of the DTensor gradients, made whole, then the scaling)
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()], foreach=True).full_tensor()
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), 0.5, norm, foreach=True)
    norms.append(round(norm.item(), 5))
    opt.step()
    # (torchtitan's logging: the loss averaged over "dp" with a functional collective)
    losses.append(round(funcol.all_reduce(loss.detach().full_tensor(), reduceOp="avg", group=dp_mesh).item(), 5))
OUT["logits"] = [str(logits.placements), list(logits.shape), list(logits.to_local().shape)]
OUT["losses"] = losses
OUT["norms"] = norms
OUT["grad_shapes"] = {k: list(p.grad.to_local().shape) for k, p in model.named_parameters()}
OUT["weights"] = {k: r6(p.full_tensor()) for k, p in model.named_parameters()}
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
full = StateDictOptions(full_state_dict=True, cpu_offload=True)
OUT["full_state_dict"] = {k: [list(v.shape), r6(v)] for k, v in get_model_state_dict(model, options=full).items()}
osd = get_optimizer_state_dict(model, opt, options=full)
OUT["full_optim"] = {k: [int(s["step"]), r6(s["exp_avg"]), r6(s["exp_avg_sq"])] for k, s in osd.get("state", {}).items()
                     if "layers.1" in k or "output" in k}
'''

# FSDP2 alone on 4 ranks over parameters whose first dims 4 does not divide (67 rows: 17,17,17,16;
# 30: 8,8,8,6): bf16 compute with fp32 gradient reduction, the root kept unsharded after forward,
# two micro-batches accumulated without sync, gradient clipping; a distributed checkpoint (the
# model's own state_dict(), the optimizer's through a Stateful as torch's DCP tutorial) loaded into
# a fresh model, which then trains on exactly as the saved one.
FSDP_DCP = '''
import torch.nn.functional as F
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
mesh = init_device_mesh("cpu", (4,))
rank = dist.get_rank()
VOCAB = 67


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 24)
        self.hidden = nn.Linear(24, 30)
        self.head = nn.Linear(30, VOCAB)

    def forward(self, tokens):
        return self.head(F.gelu(self.hidden(self.emb(tokens))))


class OptimState(Stateful):
    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def state_dict(self):
        return get_optimizer_state_dict(self.model, self.opt)

    def load_state_dict(self, state_dict):
        set_optimizer_state_dict(self.model, self.opt, optim_state_dict=state_dict)


policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def make(seed):
    torch.manual_seed(seed)
    m = TinyLM()
    for block in (m.hidden, m.head):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(m, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return m, torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.01)


gen = torch.Generator().manual_seed(7 + rank)   # each rank its own micro-batches, of its own size
batches = [[torch.randint(0, VOCAB, (2 + rank % 2, 7), generator=gen) for _ in range(2)] for _ in range(5)]


def step(m, opt, k):
    opt.zero_grad()
    total = 0.0
    for micro, tokens in enumerate(batches[k]):
        m.set_requires_gradient_sync(micro == len(batches[k]) - 1)
        logits = m(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()) / 2
        loss.backward()
        total += loss.item()
    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.3).full_tensor().item()
    opt.step()
    return [total, norm]


model, opt = make(0)
OUT["shards"] = {k: [str(p.placements), str(p.dtype), list(p.to_local().shape)] for k, p in model.named_parameters()}
OUT["dtypes_in_forward"] = []
model.head.register_forward_pre_hook(lambda mod, args: OUT["dtypes_in_forward"].append(
    [str(args[0].dtype), str(mod.weight.dtype), isinstance(mod.weight, DTensor)]))
OUT["first"] = [step(model, opt, k) for k in range(3)]
OUT["grads"] = {k: [str(p.grad.dtype), list(p.grad.to_local().shape), r6(p.grad.full_tensor())]
                for k, p in model.named_parameters()}
sd = model.state_dict()
OUT["state_dict"] = {k: [str(v.placements), list(v.to_local().shape)] for k, v in sd.items()}
dcp.save({"model": sd, "optim": OptimState(model, opt)}, checkpoint_id=sys.argv[2] + "/ckpt")
OUT["continued"] = [step(model, opt, k) for k in range(3, 5)]
fresh, fresh_opt = make(1)   # everything it resumes with comes from the checkpoint
loaded = {"model": fresh.state_dict(), "optim": OptimState(fresh, fresh_opt)}
dcp.load(loaded, checkpoint_id=sys.argv[2] + "/ckpt")
fresh.load_state_dict(loaded["model"])
resumed = [step(fresh, fresh_opt, k) for k in range(3, 5)]
OUT["resumed_equal"] = resumed == OUT["continued"]
OUT["weights"] = {k: r6(p.full_tensor()) for k, p in fresh.named_parameters()}
OUT["optim_steps"] = sorted({int(s["step"]) for s in fresh_opt.state.values()})
# a validation pass, gathered without autograd (last: torch's root, kept unsharded after it, breaks
# the next training step of its own: a Gloo error)
with torch.no_grad():
    held = torch.randint(0, VOCAB, (4, 7), generator=torch.Generator().manual_seed(99))
    OUT["validation"] = round(F.cross_entropy(fresh(held[:, :-1]).float().flatten(0, 1), held[:, 1:].flatten()).item(), 5)
'''

# DDP with a static graph, a ZeroRedundancyOptimizer (Adam's state sharded over the 4 ranks) and
# an LR schedule, fed by a DistributedSampler over 30 samples: 4 ranks get 8 each (two repeated),
# in batches of 3, 3 and 2; BatchNorm's buffers broadcast from rank 0 each forward.
DDP_ZERO = '''
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
dist.init_process_group("gloo")
rank = dist.get_rank()
gen = torch.Generator().manual_seed(0)
X = torch.randn(30, 5, generator=gen)
Y = (X @ torch.randn(5, 3, generator=gen)).tanh() + 0.1 * torch.randn(30, 3, generator=gen)
data = TensorDataset(X, Y)
sampler = DistributedSampler(data, shuffle=True, seed=3, drop_last=False)
loader = DataLoader(data, batch_size=3, sampler=sampler)
torch.manual_seed(rank)   # DDP broadcasts rank 0's parameters and buffers
model = nn.Sequential(nn.Linear(5, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
ddp = DDP(model, static_graph=True)
opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.02)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
OUT["indices"], OUT["batches"], OUT["losses"], OUT["lrs"] = [], [], [], []
for epoch in range(2):
    sampler.set_epoch(epoch)
    OUT["indices"].append(list(sampler))
    for xb, yb in loader:
        opt.zero_grad()
        loss = F.mse_loss(ddp(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
        OUT["batches"].append(len(xb))
        OUT["losses"].append(round(loss.item(), 5))
        OUT["lrs"].append(sched.get_last_lr())
OUT["weights"] = {k: r6(p) for k, p in model.named_parameters()}
OUT["buffers"] = {k: r6(b) for k, b in model.named_buffers()}
ddp.eval()   # BatchNorm on its running statistics (rank 0's, broadcast by the forward)
with torch.no_grad():
    OUT["eval"] = r6(ddp(X[:4]))
OUT["local_params"] = [sorted(p.numel() for p in group["params"]) for group in opt.optim.param_groups]
opt.consolidate_state_dict(to=0)
if rank == 0:
    osd = opt.state_dict()
    OUT["optim_state"] = {str(k): [int(v["step"]), r6(v["exp_avg"]), r6(v["exp_avg_sq"])]
                          for k, v in osd["state"].items()}
    OUT["optim_groups"] = [[g["lr"], g["initial_lr"], g["params"]] for g in osd["param_groups"]]
'''


# Values that differ from torch's by reduction order (another kernel's or collective's summation
# order: ulps, or a 5-decimal rounding flipped) are compared within a tolerance; everything else
# (shapes, placements, dtypes, indices, flags) exactly. AdamW turns an ulp in a near-zero
# gradient into a visible step (its update is about lr * sign(g)), so the Llama's weights after
# three steps differ by up to 4e-5.
_ROUNDED = 1.5e-5
_CLOSE = {
    "llama_2d": {"losses": _ROUNDED, "norms": _ROUNDED, "weights": 1e-4, "full_state_dict": 1e-4,
                 "full_optim": 1e-4},
    "fsdp_dcp": {"first": 1e-6, "continued": 1e-6, "grads": _ROUNDED, "weights": _ROUNDED, "validation": _ROUNDED},
    "ddp_zero": {"losses": _ROUNDED, "weights": _ROUNDED, "buffers": _ROUNDED, "optim_state": _ROUNDED,
                 "eval": _ROUNDED},
}


def _leaves(value, path=()):
    """``(path, number)`` for every number in a JSON value, in order."""
    if isinstance(value, dict):
        return [leaf for k in sorted(value) for leaf in _leaves(value[k], path + (k,))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, path + (i,))]
    return [(path, value)]


def _compare_close(got: dict, want: dict, close: dict) -> None:
    """``_compare`` on every answer but those in ``close``; those have torch's structure and
    numbers within their tolerance (relative and absolute)."""
    def without(res):
        return {r: {k: v for k, v in out.items() if k not in close} for r, out in res.items()}
    _compare(without(got), without(want))
    for r in want:
        for key, tol in close.items():
            if key not in want[r]:   # (an answer of rank 0 alone)
                continue
            mine, theirs = _leaves(got[r][key]), _leaves(want[r][key])
            words = [(p, v) for p, v in theirs if isinstance(v, (str, bool))]
            assert [p for p, _ in mine] == [p for p, _ in theirs], f"rank {r}, {key}: another structure"
            assert [(p, v) for p, v in mine if isinstance(v, (str, bool))] == words, f"rank {r}, {key}"
            np.testing.assert_allclose([v for _, v in mine if not isinstance(v, (str, bool))],
                                       [v for _, v in theirs if not isinstance(v, (str, bool))], rtol=tol, atol=tol,
                                       err_msg=f"rank {r}, {key}")


@pytest.mark.parametrize("name, body", [("llama_2d", LLAMA_2D), ("fsdp_dcp", FSDP_DCP), ("ddp_zero", DDP_ZERO)],
                         ids=["llama_fsdp_tp", "fsdp_uneven_dcp", "ddp_zero_sampler"])
def test_program_equals_torch(tmp_path, name, body):
    want = _run(tmp_path, "torch", name, body, 4)
    got = _run(tmp_path, "holoflow", name, body, 4)
    _compare_close(got, want, _CLOSE[name])
