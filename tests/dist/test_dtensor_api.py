"""torch's DTensor API under mock_torch: scripts written for torch.distributed.tensor (DeviceMesh,
distribute_tensor, from_local, redistribute, full_tensor, the tensor-parallel styles, a 2-D mesh
of data x tensor parallelism), FSDP2's fully_shard and distributed checkpoints, unchanged, launched on Gloo worlds by torch's launcher on torch and
by holoflow's under mock_torch: every rank's answers must be torch's."""
import inspect
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import plain_env as plain_env_module
import torch_outputs
from plain_env import plain_env

from holoflow.distributed import launch

HEADER = '''
import json, sys
if sys.argv[1] == "holoflow":
    import holoflow.mock_torch
    holoflow.mock_torch.enable()
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

def r6(t):
    return [round(v, 5) for v in t.detach().reshape(-1).tolist()]

OUT = {}
'''

FOOTER = '''
with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as f:
    json.dump(OUT, f)
dist.destroy_process_group()
'''

BASICS = '''
mesh = init_device_mesh("cpu", (2,))
rank = dist.get_rank()
OUT["mesh"] = [repr(mesh), mesh.size(), mesh.ndim, list(mesh.shape), mesh.get_local_rank(), mesh.mesh.tolist()]
full = torch.arange(24.0).reshape(4, 6)
dt = distribute_tensor(full, mesh, [Shard(0)])
OUT["shard0"] = [str(dt.placements), r6(dt.to_local()), list(dt.shape), isinstance(dt, DTensor),
                 isinstance(full, DTensor), repr(dt.device_mesh)]
cols = dt.redistribute(mesh, [Shard(1)])
OUT["shard1"] = [str(cols.placements), r6(cols.to_local()), r6(cols.full_tensor())]
OUT["replicate"] = r6(cols.redistribute(placements=[Replicate()]).to_local())
# distribute_tensor takes the first rank's data (src_data_rank=0), or each rank's own (None)
# (a fresh tensor for each: torch's Replicate broadcasts into the tensor it is given, in place)
OUT["src0"] = r6(distribute_tensor(torch.full((2, 2), float(rank)), mesh, [Replicate()]).to_local())
OUT["src_none"] = r6(distribute_tensor(torch.full((2, 2), float(rank)), mesh, [Replicate()],
                                       src_data_rank=None).to_local())
OUT["src0_shard"] = r6(distribute_tensor(torch.full((2, 2), float(rank)), mesh, [Shard(0)]).to_local())
OUT["partial_dist"] = r6(distribute_tensor(torch.ones(4), mesh, [Partial()]).to_local())
# ops: the logical values and the placements they produce
w = distribute_tensor(torch.ones(6, 3), mesh, [Shard(0)])
w.requires_grad_()
x = distribute_tensor(full, mesh, [Shard(1)])
y = x @ w
OUT["matmul"] = [str(y.placements), r6(y.to_local()), r6(y.full_tensor())]
y.full_tensor().sum().backward()
OUT["wgrad"] = [str(w.grad.placements), r6(w.grad.to_local()), w.is_leaf]
z = DTensor.from_local(torch.ones(2) * (rank + 1), mesh, [Partial()])
OUT["partial"] = [r6(z.redistribute(mesh, [Replicate()]).to_local()), r6(z.full_tensor())]
try:
    z.redistribute(mesh, [Replicate()]).redistribute(mesh, [Partial()])
    OUT["to_partial"] = "allowed"
except RuntimeError as e:
    OUT["to_partial"] = "refused"
# to_local's gradient is laid out like the tensor (a replica's gradient is the gradient), unless told
# (every rank computes the same gradient: a replica's; where ranks differ torch keeps each rank's own,
# holoflow the first rank's)
a = distribute_tensor(torch.ones(4, requires_grad=True), mesh, [Replicate()])
(a.to_local() * torch.arange(4.0)).sum().backward()
OUT["to_local_grad"] = [a.is_leaf, str(a.grad.placements), r6(a.grad.to_local())]
b = distribute_tensor(torch.ones(4, requires_grad=True), mesh, [Replicate()])
(b.to_local(grad_placements=[Partial()]) * (rank + 1)).sum().backward()
OUT["to_local_grad_partial"] = r6(b.grad.full_tensor())
# from_local: differentiable; a shard's gradient is its piece, a replica's the all-reduced one
loc = torch.arange(3.0, requires_grad=True)
s = DTensor.from_local(loc * (rank + 1), mesh, [Shard(0)])
(s * s).sum().backward()
OUT["from_local"] = [list(s.shape), r6(loc.grad)]
loc2 = torch.arange(3.0, requires_grad=True)
rep = DTensor.from_local(loc2, mesh, [Replicate()], run_check=False)
(rep * distribute_tensor(torch.tensor([1.0, 2.0, 3.0]), mesh, [Shard(0)])).sum().backward()
OUT["from_local_replicate"] = r6(loc2.grad)
# a process group of the mesh for torch.distributed's collectives
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, group=mesh.get_group())
OUT["group"] = t.tolist()
# local_map: a function of local tensors on DTensors (a column-sharded W times a row-sharded X is a
# partial sum; an input laid out otherwise is redistributed or refused)
from torch.distributed.tensor.experimental import local_map
lw = distribute_tensor(torch.arange(16.0).reshape(4, 4) / 10, mesh, [Shard(1)])
lw.requires_grad_()
lx = distribute_tensor(torch.arange(8.0).reshape(4, 2) / 10, mesh, [Shard(0)])
mm = local_map(torch.mm, out_placements=[Partial()], in_placements=([Shard(1)], [Shard(0)]))
ly = mm(lw, lx)
(ly.full_tensor() ** 2).sum().backward()
OUT["local_map"] = [str(ly.placements), r6(ly.to_local()), r6(ly.full_tensor()), str(lw.grad.placements),
                    r6(lw.grad.to_local())]
scaled = local_map(lambda a, k: (a * k, a.sum()), out_placements=([Shard(0)], [Partial()]),
                   in_placements=([Shard(0)], None), redistribute_inputs=True)(lw.detach(), 2.0)
OUT["local_map_redistributed"] = [[str(v.placements), r6(v.full_tensor())] for v in scaled]
try:
    mm(lx, lx)
    OUT["local_map_mismatch"] = "allowed"
except ValueError:
    OUT["local_map_mismatch"] = "ValueError"
OUT["local_map_plain"] = r6(mm(torch.ones(2, 2), torch.ones(2, 2)))
'''

TP_MLP = '''
mesh = init_device_mesh("cpu", (2,))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
OUT["layouts"] = {k: str(p.placements) for k, p in model.named_parameters()}
OUT["local_shapes"] = {k: list(p.to_local().shape) for k, p in model.named_parameters()}
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
gen = torch.Generator().manual_seed(1)
x, y = torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)
losses = []
for _ in range(3):
    opt.zero_grad()
    out = model(x)
    loss = ((out - y) ** 2).mean()
    loss.backward()
    opt.step()
    losses.append(round(loss.item(), 5))
OUT["out_local"] = [isinstance(out, DTensor), list(out.shape)]
OUT["losses"] = losses
OUT["weights"] = {k: r6(p.full_tensor()) for k, p in model.named_parameters()}
OUT["grads"] = {k: [str(p.grad.placements), r6(p.grad.full_tensor())] for k, p in model.named_parameters()}

# embedding rowwise (vocab split, partial sums all-reduced) and colwise (embedding dim split)
torch.manual_seed(2)
emb = nn.Embedding(6, 4)
emb2 = nn.Embedding(6, 4)
parallelize_module(emb, mesh, RowwiseParallel(input_layouts=Replicate()))
parallelize_module(emb2, mesh, ColwiseParallel(output_layouts=Replicate()))
ids = torch.tensor([[0, 5, 2], [3, 3, 1]])
e = emb(ids)
e.sum().backward()
e2 = emb2(ids)
(e2 * e2).sum().backward()
OUT["embedding"] = [r6(e), str(emb.weight.placements), r6(emb.weight.grad.full_tensor()),
                    r6(e2), str(emb2.weight.placements), r6(emb2.weight.grad.full_tensor())]

# sequence parallel: a LayerNorm on sequence shards
torch.manual_seed(3)
ln = nn.LayerNorm(4)
parallelize_module(ln, mesh, SequenceParallel())
seq = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(2, 6, 4) / 10
mine = seq[:, 3 * dist.get_rank(): 3 * dist.get_rank() + 3]
o = ln(mine)
(o.full_tensor() ** 2).sum().backward()
OUT["sequence"] = [str(o.placements), list(o.shape), r6(o.to_local()), r6(ln.weight.grad.full_tensor()),
                   str(ln.weight.placements)]

# PrepareModuleInput: a sharded input gathered before a module that needs it whole
class Double(nn.Module):
    def forward(self, t):
        return t * 2
d = Double()
parallelize_module(d, mesh, PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Replicate(),
                                               use_local_output=True))
OUT["prepare_input"] = r6(d(torch.full((2,), float(dist.get_rank()))))

# loss_parallel: a colwise head's class-sharded logits against plain labels
from torch.distributed.tensor.parallel import loss_parallel
torch.manual_seed(4)
head = nn.Linear(6, 10)
parallelize_module(head, mesh, ColwiseParallel(use_local_output=False))
feats = torch.randn(5, 6, generator=torch.Generator().manual_seed(5))
with loss_parallel():
    logits = head(feats)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([1, 9, 0, 4, 4]))
    per_row = torch.nn.functional.cross_entropy(logits, torch.tensor([1, 9, 0, 4, 4]), reduction="none")
    loss.backward()
# (the loss is Replicate(): every rank's to_local() is the loss, which a training loop logs)
OUT["loss_parallel"] = [str(logits.placements), round(loss.full_tensor().item(), 5), round(loss.item(), 5),
                        str(loss.placements), round(loss.to_local().item(), 5), str(per_row.placements),
                        r6(per_row.to_local()), r6(head.weight.grad.full_tensor()), r6(head.bias.grad.full_tensor())]

# distribute_module: a custom partition and input/output functions
lin = nn.Linear(4, 2)
def shard_rows(name, module, mesh):
    if isinstance(module, nn.Linear):
        module.register_parameter("weight", nn.Parameter(distribute_tensor(module.weight, mesh, [Shard(0)])))
distribute_module(lin, mesh, shard_rows,
                  input_fn=lambda mod, inputs, mesh: DTensor.from_local(inputs[0], mesh, [Replicate()]),
                  output_fn=lambda mod, outputs, mesh: outputs.full_tensor())
OUT["distribute_module"] = [str(lin.weight.placements), str(lin.bias.placements),
                            list(lin(torch.ones(3, 4)).shape)]
'''

MESH_2D = '''
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
tp, dp = mesh["tp"], mesh["dp"]
OUT["mesh"] = [repr(mesh), repr(tp), tp.mesh.tolist(), dp.mesh.tolist(), mesh.get_local_rank("tp"),
               mesh.get_local_rank("dp"), list(mesh.get_coordinate()), tp.mesh_dim_names,
               sorted(dist.get_process_group_ranks(tp.get_group()))]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
parallelize_module(model, tp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(10 + mesh.get_local_rank("dp"))   # each data-parallel replica its data
x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 3, generator=gen)
losses = []
for _ in range(3):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    for p in model.parameters():   # data parallel by hand: average the gradients over "dp"
        g = p.grad.to_local()
        dist.all_reduce(g, group=dp.get_group())
        g /= dp.size()
    opt.step()
    losses.append(round(loss.item(), 5))
OUT["losses"] = losses
OUT["weights"] = {k: r6(p.full_tensor()) for k, p in model.named_parameters()}
'''

FSDP = '''
from torch.distributed.fsdp import FSDPModule, fully_shard
mesh = init_device_mesh("cpu", (2,))
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
OUT["class"] = [isinstance(model, FSDPModule), type(model).__name__, isinstance(model[0], FSDPModule),
                isinstance(model[1], FSDPModule)]
OUT["layouts"] = {k: [str(p.placements), list(p.to_local().shape)] for k, p in model.named_parameters()}
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(10 + rank)   # each rank its own batch
x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 3, generator=gen)
losses, norms = [], []
for _ in range(3):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    norms.append(round(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5).full_tensor().item(), 5))
    opt.step()
    losses.append(round(loss.item(), 5))
OUT["losses"] = losses
OUT["norms"] = norms
OUT["weights"] = {k: r6(p.full_tensor()) for k, p in model.named_parameters()}
OUT["grads"] = {k: [str(p.grad.placements), r6(p.grad.full_tensor())] for k, p in model.named_parameters()}
OUT["state_dict"] = sorted([k, str(v.placements)] for k, v in model.state_dict().items())

# the unsharded weights' storage: freed after forward (model[2] keeps its own until backward)
seen = []
for layer in (model[0], model[2]):
    layer.register_forward_pre_hook(lambda mod, args: seen.append(mod.weight))
model[2].set_reshard_after_forward(False)
loss = ((model(x) - y) ** 2).mean()
OUT["unsharded_after_forward"] = [[list(w.shape), w.untyped_storage().nbytes() > 0] for w in seen]
loss.backward()   # (torch pads its gather buffers: whether storage is held is compared, not its bytes)
OUT["after_backward"] = [w.untyped_storage().nbytes() > 0 for w in seen]
model[2].set_reshard_after_forward(True)

# gradient accumulation without communication, then one synchronized micro-batch
opt.zero_grad()
model.set_requires_gradient_sync(False)
for j in range(2):
    ((model(x * (j + 2)) - y) ** 2).mean().backward()
OUT["unsynced_grads"] = [p.grad is None for p in model.parameters()]
model.set_requires_gradient_sync(True)
((model(x) - y) ** 2).mean().backward()
OUT["accumulated"] = {k: r6(p.grad.full_tensor()) for k, p in model.named_parameters()}

# matrices sharded on their columns (shard_placement_fn)
torch.manual_seed(1)
cols = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))
fully_shard(cols, mesh=mesh, shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else None)
copt = torch.optim.SGD(cols.parameters(), lr=0.1)
for _ in range(2):
    copt.zero_grad()
    ((cols(x) - 1) ** 2).mean().backward()
    copt.step()
OUT["columns"] = {k: [str(p.placements), list(p.to_local().shape), r6(p.full_tensor())]
                  for k, p in cols.named_parameters()}

# mixed precision: bf16 compute, gradients accumulated unsynced and summed across the ranks in
# bf16 (reduce_dtype None) or in fp32; exact values (not rounded): the reduce dtype shows
from torch.distributed.fsdp import MixedPrecisionPolicy
for tag, reduce_dtype in (("mp_reduce_bf16", None), ("mp_reduce_fp32", torch.float32)):
    torch.manual_seed(2)
    mpm = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    fully_shard(mpm[0], mesh=mesh, mp_policy=policy)
    fully_shard(mpm, mesh=mesh, mp_policy=policy)
    mpm.set_requires_gradient_sync(False)
    ((mpm(x * 3).float() - y) ** 2).mean().backward()
    mpm.set_requires_gradient_sync(True)
    ((mpm(x).float() - y) ** 2).mean().backward()
    OUT[tag] = {k: [str(p.grad.dtype), p.grad.full_tensor().tolist()] for k, p in mpm.named_parameters()}

# optimizer in backward (torchtune's pattern): each shard stepped by its post-accumulate-grad hook
torch.manual_seed(3)
ob = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
fully_shard(ob[0], mesh=mesh)
fully_shard(ob, mesh=mesh)
in_bwd = {p: torch.optim.SGD([p], lr=0.1) for p in ob.parameters()}
stepped = []

def step_in_backward(p):
    stepped.append(isinstance(p.grad, DTensor))
    in_bwd[p].step()
    in_bwd[p].zero_grad()
for p in ob.parameters():
    p.register_post_accumulate_grad_hook(step_in_backward)
for _ in range(2):
    ((ob(x) - y) ** 2).mean().backward()
OUT["optimizer_in_backward"] = [stepped, {k: [p.grad is None, r6(p.full_tensor())] for k, p in ob.named_parameters()}]
'''

DCP = '''
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("cpu", (2,))
rank = dist.get_rank()

def make(seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    fully_shard(m[0], mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, torch.optim.AdamW(m.parameters(), lr=0.05)

gen = torch.Generator().manual_seed(10 + rank)
x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 3, generator=gen)

def step(m, opt):
    opt.zero_grad()
    loss = ((m(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return round(loss.item(), 5)

model, opt = make(0)
first = [step(model, opt) for _ in range(2)]
msd, osd = get_state_dict(model, opt)
dcp.save({"model": msd, "optim": osd}, checkpoint_id=sys.argv[2] + "/ckpt")
cont = [step(model, opt) for _ in range(2)]
m2, o2 = make(1)   # another model: everything it resumes with comes from the checkpoint
msd2, osd2 = get_state_dict(m2, o2)
sd = {"model": msd2, "optim": osd2}
dcp.load(sd, checkpoint_id=sys.argv[2] + "/ckpt")
set_state_dict(m2, o2, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
OUT["losses"] = [first, cont, [step(m2, o2) for _ in range(2)]]
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
OUT["full"] = {k: r6(v) for k, v in full.items()}
fosd = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
OUT["full_optim"] = {k: {n: r6(v) for n, v in s.items()} for k, s in fosd.get("state", {}).items()}
OUT["full_groups"] = [g["params"] for g in fosd.get("param_groups", [])]
m3, o3 = make(2)
set_model_state_dict(m3, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
OUT["broadcast_loaded"] = {k: r6(p.full_tensor()) for k, p in m3.named_parameters()}
'''


OPS = '''
import torch.nn.functional as F
mesh = init_device_mesh("cpu", (2,))
A = torch.arange(24.0).reshape(4, 6) / 10
C = torch.arange(24.0).reshape(4, 6) / 7 - 1
W = torch.arange(18.0).reshape(6, 3) / 10 - 0.5
LAYOUT = {"S0": [Shard(0)], "S1": [Shard(1)], "R": [Replicate()]}
CASES = {
    "add": lambda a, c: a + c, "mul": lambda a, c: a * c, "where": lambda a, c: torch.where(a > 1, a, c),
    "cat0": lambda a, c: torch.cat([a, c], 0), "cat1": lambda a, c: torch.cat([a, c], 1),
    "a_ct": lambda a, c: a @ c.t(), "rowdot": lambda a, c: (a * c).sum(dim=-1, keepdim=True),
    "mm": lambda a, c: a @ distribute_tensor(W, mesh, [Replicate()]),
    "mm_w_s0": lambda a, c: a @ distribute_tensor(W, mesh, [Shard(0)]),
    "sum": lambda a, c: a.sum(), "sum0": lambda a, c: a.sum(0), "sum1": lambda a, c: a.sum(1),
    "mean1": lambda a, c: a.mean(1), "amax1": lambda a, c: a.amax(1), "softmax1": lambda a, c: a.softmax(1),
    "t": lambda a, c: a.t(), "view": lambda a, c: a.view(2, 12), "view3": lambda a, c: a.view(4, 2, 3),
    "flat": lambda a, c: a.reshape(-1), "relu": lambda a, c: F.relu(a - 1), "gelu": lambda a, c: F.gelu(a),
    "layer_norm": lambda a, c: F.layer_norm(a, (6,)), "rows": lambda a, c: a[1:3], "cols": lambda a, c: a[:, 2:5],
    "expand": lambda a, c: a.unsqueeze(0).expand(2, 4, 6), "max1": lambda a, c: a.max(1).values,
    "argmax1": lambda a, c: a.argmax(1), "cumsum1": lambda a, c: a.cumsum(1), "norm": lambda a, c: a.norm(),
    "to_f64": lambda a, c: a.to(torch.float64),
}
TWO = {"add", "mul", "where", "cat0", "cat1", "a_ct", "rowdot"}
for name, fn in CASES.items():
    for la in LAYOUT:
        for lc in (LAYOUT if name in TWO else ["S0"]):
            a = distribute_tensor(A, mesh, LAYOUT[la]).requires_grad_()
            c = distribute_tensor(C, mesh, LAYOUT[lc]).requires_grad_()
            y = fn(a, c)
            row = [str(y.placements), r6(y.full_tensor())]
            if y.dtype.is_floating_point:   # gradients through the DTensor ops (a weighted sum)
                weights = torch.linspace(0.5, 1.5, y.numel()).reshape(y.shape)
                (y * distribute_tensor(weights, mesh, [Replicate()] * mesh.ndim)).sum().backward()
                row += [r6(g.full_tensor()) if g is not None else None for g in (a.grad, c.grad)]
            OUT[f"{name}[{la},{lc}]"] = row
'''


OPS_2D = '''
import torch.nn.functional as F
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
A = torch.arange(48.0).reshape(4, 12) / 10
C = torch.arange(48.0).reshape(4, 12) / 7 - 1
W = torch.arange(36.0).reshape(12, 3) / 10 - 0.5
ONE = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}
LAYOUT = {a + b: [ONE[a], ONE[b]] for a in ONE for b in ONE}
CASES = {
    "add": lambda a, c: a + c, "cat1": lambda a, c: torch.cat([a, c], 1), "a_ct": lambda a, c: a @ c.t(),
    "mm": lambda a, c: a @ distribute_tensor(W, mesh, [Replicate(), Shard(0)]), "sum1": lambda a, c: a.sum(1),
    "softmax1": lambda a, c: a.softmax(1), "t": lambda a, c: a.t(), "layer_norm": lambda a, c: F.layer_norm(a, (12,)),
    "cols": lambda a, c: a[:, 3:9], "flat": lambda a, c: a.reshape(-1), "mean": lambda a, c: a.mean(),
}
TWO = {"add", "cat1", "a_ct"}
for name, fn in CASES.items():
    for la in LAYOUT:
        for lc in (LAYOUT if name in TWO else ["RR"]):
            a = distribute_tensor(A, mesh, LAYOUT[la]).requires_grad_()
            c = distribute_tensor(C, mesh, LAYOUT[lc]).requires_grad_()
            y = fn(a, c)
            weights = torch.linspace(0.5, 1.5, y.numel()).reshape(y.shape)
            (y * distribute_tensor(weights, mesh, [Replicate()] * mesh.ndim)).sum().backward()
            OUT[f"{name}[{la},{lc}]"] = [str(y.placements), r6(y.full_tensor())] + [
                r6(g.full_tensor()) if g is not None else None for g in (a.grad, c.grad)]
'''


UNEVEN = '''
from torch.distributed.fsdp import fully_shard
mesh = init_device_mesh("cpu", (4,))   # sizes that 4 ranks split unevenly: torch.chunk's pieces
rank = dist.get_rank()
A = torch.arange(30.0).reshape(5, 6) / 10
for n in (1, 2, 3, 5, 6, 7, 9, 10):
    d = distribute_tensor(torch.arange(float(n * 3)).reshape(n, 3), mesh, [Shard(0)])
    OUT[f"rows{n}"] = [list(d.to_local().shape), r6(d.to_local())]
a = distribute_tensor(A, mesh, [Shard(0)]).requires_grad_()
OUT["a_local"] = [list(a.to_local().shape), r6(a.to_local())]
b = a.redistribute(mesh, [Shard(1)])
OUT["s0_to_s1"] = [list(b.to_local().shape), r6(b.to_local())]
c = distribute_tensor(torch.arange(12.0).reshape(6, 2), mesh, [Shard(1)])
OUT["two_cols"] = [list(c.to_local().shape), r6(c.redistribute(mesh, [Shard(0)]).to_local())]
y = (a * 2 + 1).relu().sum(1)
OUT["rowsum"] = [str(y.placements), list(y.to_local().shape), r6(y.full_tensor())]
z = a @ distribute_tensor(torch.ones(6, 3), mesh, [Replicate()])
OUT["mm"] = [str(z.placements), list(z.to_local().shape), r6(z.full_tensor())]
(y.sum() + z.sum()).backward()
OUT["grad"] = [str(a.grad.placements), list(a.grad.to_local().shape), r6(a.grad.to_local())]
# from_local with torch.chunk's pieces and the logical shape given
pieces = torch.arange(30.0).reshape(10, 3).chunk(4)
mine = pieces[rank] if rank < len(pieces) else torch.empty(0, 3)
fl = DTensor.from_local(mine, mesh, [Shard(0)], shape=torch.Size([10, 3]), stride=(3, 1))
OUT["from_local"] = [list(fl.shape), r6(fl.full_tensor()), r6(fl.redistribute(mesh, [Shard(1)]).to_local())]
# FSDP2 on uneven parameters: 5 rows over 4 ranks (2,2,1,0), 10 (3,3,3,1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 10), nn.Tanh(), nn.Linear(10, 2))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
OUT["fsdp_layouts"] = {k: [str(p.placements), list(p.to_local().shape), r6(p.to_local())] for k, p in model.named_parameters()}
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(10 + rank)
x, t = torch.randn(4, 3, generator=gen), torch.randn(4, 2, generator=gen)
losses = []
for _ in range(3):
    opt.zero_grad()
    loss = ((model(x) - t) ** 2).mean()
    loss.backward()
    opt.step()
    losses.append(round(loss.item(), 5))
OUT["fsdp_losses"] = losses
OUT["fsdp_after"] = {k: [list(p.to_local().shape), r6(p.to_local()), list(p.grad.to_local().shape)] for k, p in model.named_parameters()}
OUT["fsdp_sd"] = {k: [list(v.to_local().shape)] for k, v in model.state_dict().items()}
# a 2x2 mesh: a dim split on both mesh dims is chunked on the first, then each piece on the second
mesh2 = init_device_mesh("cpu", (2, 2))
for name, pl in (("S0S0", [Shard(0), Shard(0)]), ("S0S1", [Shard(0), Shard(1)]), ("S1S0", [Shard(1), Shard(0)])):
    d = distribute_tensor(torch.arange(35.0).reshape(5, 7), mesh2, pl)
    OUT[name] = [list(d.to_local().shape), r6(d.to_local()),
                 r6(d.redistribute(mesh2, [Shard(1), Shard(1)]).to_local()), r6((d * 2).sum(1).full_tensor())]
'''


def _launch(tmp_path, lib: str, name: str, text: str, ranks: int) -> list:
    """Runs the script ``text`` on ``ranks`` Gloo ranks, by torch's launcher on torch or by
    holoflow's under mock_torch (``sys.argv[1]``); each rank's JSON answers, by rank.

    holoflow's launcher is its ``translate`` of the arguments, then torchrun: run as such here, so
    that the launching process does not import all of holoflow first, which it never uses (2-4 s
    a launch). test_env_launch.py runs ``python -m holoflow.distributed.launch`` itself."""
    script = tmp_path / f"{name}.py"
    script.write_text(text)
    outdir = tmp_path / f"{name}_{lib}"
    outdir.mkdir()
    args = ["--nproc_per_node", str(ranks), str(script), lib, str(outdir)]
    cmd = [sys.executable, "-m", "torch.distributed.run", *(launch.translate(args) if lib == "holoflow" else args)]
    out = subprocess.run(cmd, env=plain_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    for _ in range(3):   # the reference itself: torch's Gloo teardown aborts now and then (twice in a row too)
        if out.returncode == 0 or lib != "torch" or "terminate called without an active exception" not in out.stderr:
            break
        out = subprocess.run(cmd, env=plain_env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(ranks)]


def launch_parts(text: str, ranks: int) -> dict:
    """What torch's run of the script ``text`` depends on (the store key's parts, tests/torch_outputs.py):
    the script, the launching code (its command and environment) and the world size."""
    return {"script": text, "harness": inspect.getsource(_launch) + inspect.getsource(plain_env_module),
            "world_size": ranks}


def _script_outputs(tmp_path, lib: str, name: str, text: str, ranks: int) -> dict:
    """Every rank's answers to the script ``text``: holoflow's run, or torch's (recorded)."""
    if lib == "torch":
        outs = torch_outputs.recorded(f"{name}-{ranks}", launch_parts(text, ranks),
                                      lambda: _launch(tmp_path, lib, name, text, ranks))
    else:
        outs = _launch(tmp_path, lib, name, text, ranks)
    return dict(enumerate(outs))


def script_text(body: str) -> str:
    return textwrap.dedent(HEADER) + textwrap.dedent(body) + textwrap.dedent(FOOTER)


def _run(tmp_path, lib: str, name: str, body: str, ranks: int) -> dict:
    """Every rank's answers to HEADER + ``body`` + FOOTER on ``ranks`` ranks, holoflow's or torch's."""
    return _script_outputs(tmp_path, lib, name, script_text(body), ranks)


def _compare(got: dict, want: dict) -> None:
    for r in want:
        for key in want[r]:
            assert got[r][key] == want[r][key], f"rank {r}, {key}: holoflow {got[r][key]} != torch {want[r][key]}"
        assert set(got[r]) == set(want[r])


@pytest.mark.parametrize("name, body, ranks", [("basics", BASICS, 2), ("tp_mlp", TP_MLP, 2),
                                               ("mesh_2d", MESH_2D, 4), ("fsdp", FSDP, 2), ("dcp", DCP, 2),
                                               ("uneven", UNEVEN, 4)],
                         ids=["basics", "tp_mlp", "mesh_2d", "fsdp", "dcp", "uneven"])
def test_dtensor_script_equals_torch(tmp_path, name, body, ranks):
    want = _run(tmp_path, "torch", name, body, ranks)
    got = _run(tmp_path, "holoflow", name, body, ranks)
    _compare(got, want)


# holoflow may contract a split dim (an all-to-all of one operand, output Partial) where torch's
# cost model all-gathers the other operand (output Shard): both legal, the values equal
_CONTRACTIONS = {"mm", "mm_w_s0", "a_ct"}


@pytest.mark.parametrize("name, body, ranks", [("ops", OPS, 2), ("ops_2d", OPS_2D, 4)], ids=["1d", "2x2"])
def test_dtensor_ops_equal_torchs_and_make_no_partial_torch_does_not(tmp_path, name, body, ranks):
    """Ops over Shard(0)/Shard(1)/Replicate operands (30 ops on 2 Gloo ranks; 11 over the 9
    layouts of a 2x2 mesh, 4 ranks): every logical value and both operands' gradients (of a
    weighted sum, through the DTensor ops' backward) are torch's; holoflow's layouts may differ
    from torch's (its own cost model), but an output is Partial only where torch's is too, or where
    holoflow contracts a split dim (_CONTRACTIONS): an S -> P padding made `a(S0) + c(S1)`, cat,
    slices, cumsum and reshapes partial sums."""
    want = _run(tmp_path, "torch", name, body, ranks)
    got = _run(tmp_path, "holoflow", name, body, ranks)
    for r in want:
        assert set(got[r]) == set(want[r])
        for key, (placements, value, *grads) in want[r].items():
            np.testing.assert_allclose(got[r][key][1], value, rtol=1e-4, atol=1e-4, err_msg=key)
            assert len(got[r][key]) == 2 + len(grads), key
            for g, w in zip(got[r][key][2:], grads):
                assert (g is None) == (w is None), key
                if w is not None:
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"{key} gradient")
            if "Partial" in got[r][key][0] and key.split("[")[0] not in _CONTRACTIONS:
                assert "Partial" in placements, f"{key}: holoflow {got[r][key][0]}, torch {placements}"
