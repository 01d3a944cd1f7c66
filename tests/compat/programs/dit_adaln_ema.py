# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A diffusion transformer (DiT) training step as its reference code writes it: patch tokens,
sinusoidal timestep features (torch.outer, cos/sin), label embeddings through F.embedding with a
classifier-free-guidance null class chosen by torch.where(torch.rand(...) < p, ...), adaLN-Zero
modulation (shift/scale/gate chunks of one Linear, zero-initialised), grouped-query attention by
F.scaled_dot_product_attention(enable_gqa=True), a GLU feed-forward (nn.GLU), the v-prediction
loss with a logaddexp-weighted SNR, nan_to_num / clamp_ guards, an EMA of the weights by
torch._foreach_lerp_ and by swa_utils.AveragedModel(get_ema_multi_avg_fn), and
clip_grad_norm_(foreach=True)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

DIM, HEADS, KV_HEADS, CLASSES, PATCH, IMG = 16, 4, 2, 3, 2, 4
N = (IMG // PATCH) ** 2


def timestep_features(t, dim=DIM):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = torch.outer(t, freqs)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class DiTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(DIM, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(DIM, elementwise_affine=False)
        self.q = nn.Linear(DIM, DIM)
        self.kv = nn.Linear(DIM, 2 * DIM // HEADS * KV_HEADS)
        self.proj = nn.Linear(DIM, DIM)
        self.ff = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GLU(), nn.Linear(2 * DIM, DIM))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(DIM, 6 * DIM))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def attend(self, x):
        b, n, _ = x.shape
        hd = DIM // HEADS
        q = self.q(x).view(b, n, HEADS, hd).transpose(1, 2)
        k, v = self.kv(x).view(b, n, 2, KV_HEADS, hd).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.proj(out.transpose(1, 2).reshape(b, n, DIM))

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c)[:, None].chunk(6, dim=-1)
        x = x + gate1 * self.attend(self.norm1(x) * (1 + scale1) + shift1)
        return x + gate2 * self.ff(self.norm2(x) * (1 + scale2) + shift2)


class DiT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(PATCH * PATCH, DIM)
        self.pos = nn.Parameter(torch.randn(1, N, DIM) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.SiLU(), nn.Linear(DIM, DIM))
        self.label_table = nn.Parameter(torch.randn(CLASSES + 1, DIM) * 0.02)   # last row: null class
        self.blocks = nn.ModuleList([DiTBlock(), DiTBlock()])
        self.final = nn.Linear(DIM, PATCH * PATCH)

    def forward(self, x, t, y):
        b = x.shape[0]
        tokens = x.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH).reshape(b, N, PATCH * PATCH)
        h = self.patch(tokens) + self.pos
        c = self.t_mlp(timestep_features(t)) + F.embedding(y, self.label_table)
        for blk in self.blocks:
            h = blk(h, c)
        return self.final(h)


def v_loss(model, x0, g, p_uncond=0.3):
    b = x0.shape[0]
    t = torch.rand(b, generator=g)
    alpha, sigma = torch.cos(t * math.pi / 2), torch.sin(t * math.pi / 2)
    noise = torch.randn(x0.shape, generator=g)
    xt = alpha[:, None, None] * x0 + sigma[:, None, None] * noise
    labels = torch.randint(0, CLASSES, (b,), generator=g)
    labels = torch.where(torch.rand(b, generator=g) < p_uncond, torch.full_like(labels, CLASSES), labels)
    v = alpha[:, None, None] * noise - sigma[:, None, None] * x0
    target = v.unfold(1, PATCH, PATCH).unfold(2, PATCH, PATCH).reshape(b, N, PATCH * PATCH)
    pred = torch.nan_to_num(model(xt, t, labels), nan=0.0, posinf=1e4, neginf=-1e4)
    log_snr = 2 * (torch.log(alpha.clamp_(min=1e-4)) - torch.log(sigma.clamp(min=1e-4)))
    weight = torch.exp(-torch.logaddexp(torch.zeros_like(log_snr), -log_snr))   # sigmoid(log SNR)
    return (weight[:, None, None] * (pred - target) ** 2).mean()


torch.manual_seed(0)
model = DiT()
ema_params = [p.detach().clone() for p in model.parameters()]
swa = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)

g = torch.Generator().manual_seed(7)
LOSSES = []
for step in range(4):
    x0 = torch.randn(4, IMG, IMG, generator=g)
    loss = v_loss(model, x0, g)
    opt.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
    opt.step()
    with torch.no_grad():
        torch._foreach_lerp_(ema_params, [p.detach() for p in model.parameters()], 0.1)
    swa.update_parameters(model)
    LOSSES += [loss.item(), float(norm)]

with torch.no_grad():
    drift = sum(float((a - b).abs().sum()) for a, b in zip(ema_params, swa.module.parameters()))
LOSSES.append(drift)

MODELS = {"dit": model}
