"""Auto-parallel on a Llama-style decoder (RMSNorm, rotary embeddings from position ids made
inside ``global_mode``, grouped-query attention through ``repeat_interleave`` and causal SDPA,
SwiGLU, no biases, AdamW): when memory decides (``HeavyMemoryDown``) the planner shards the
projections, lays the blocks' outputs out and picks ZeRO and recomputation, on 2 simulated
ranks, and that plan trains as one process eager does."""
import numpy as np

import holoflow as flow
import holoflow.nn.functional as F
from holoflow import nn
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from holoflow.graph.graph import Graph
from holoflow.utils.global_view import global_mode

VOCAB, HIDDEN, HEADS, KV_HEADS, INTER = 24, 32, 4, 2, 64


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(flow.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * flow.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return flow.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = HIDDEN // HEADS
        self.q_proj = nn.Linear(HIDDEN, HEADS * self.head_dim, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.o_proj = nn.Linear(HEADS * self.head_dim, HIDDEN, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000.0 ** (flow.arange(0, self.head_dim, 2).float()
                                                            / self.head_dim)), persistent=False)

    def forward(self, x, positions):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2)
        freqs = positions[:, :, None].float() * self.inv_freq[None, None, :]
        emb = flow.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(HEADS // KV_HEADS, dim=1), v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.attn_norm, self.mlp_norm = Attention(), RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.gate = nn.Linear(HIDDEN, INTER, bias=False)
        self.up = nn.Linear(HIDDEN, INTER, bias=False)
        self.down = nn.Linear(INTER, HIDDEN, bias=False)

    def forward(self, x, positions):
        x = x + self.attn(self.attn_norm(x), positions)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, layers: int = 1):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([Layer() for _ in range(layers)])
        self.norm = RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        positions = flow.arange(ids.shape[1]).unsqueeze(0)   # a global tensor inside global_mode
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h, positions)
        return self.head(self.norm(h))


def _loss(model, ids):
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def test_a_llama_decoder_planned_when_memory_decides_trains_as_one_process():
    flow.manual_seed(0)
    ref = Llama()
    state = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    ids = flow.tensor(np.random.default_rng(0).integers(0, VOCAB, (4, 9)))
    opt = flow.optim.AdamW(ref.parameters(), lr=2e-3, weight_decay=0.0)
    want = []
    for _ in range(2):
        loss = _loss(ref, ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())

    def rank(r):
        P = flow.placement("cpu", ranks=[0, 1])
        m = Llama()
        m.load_state_dict(state)
        m.to_global(placement=P, sbp=B)
        o = flow.optim.AdamW(m.parameters(), lr=2e-3, weight_decay=0.0)

        class Train(Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(o)
                self.config.enable_auto_parallel()
                self.config.enable_auto_memory("HeavyMemoryDown")

            def build(self, ids):
                with global_mode(True, placement=P, sbp=B):
                    loss = _loss(self.m, ids)
                loss.backward()
                return loss
        g = Train()
        x = ids.to_global(placement=P, sbp=B).to_global(sbp=S(0))
        losses = [g(x).to_global(sbp=B).to_local().item() for _ in range(2)]
        plan = g.auto_parallel_plan()
        weights = {k: v.to_global(sbp=B).to_local().numpy() for k, v in m.state_dict().items()}
        return losses, plan, weights
    for losses, plan, weights in world.simulate(2, rank, timeout=300):
        changed = {k for k, (before, after) in plan.choices.items() if before != after}
        assert {"m.layers.0.attn.q_proj.weight", "m.layers.0.gate.weight", "ZeRO"} <= changed, plan
        assert plan.chosen.memory_bytes < plan.start.memory_bytes, plan
        np.testing.assert_allclose(losses, want, rtol=1e-5)
        for k, v in ref.state_dict().items():
            # (Adam divides by the root of the second moment: a gradient near zero, summed in another
            # order on shards, moves its weight by a visible fraction of one lr-sized step)
            np.testing.assert_allclose(weights[k], v.numpy(), rtol=1e-4, atol=2e-5, err_msg=k)
