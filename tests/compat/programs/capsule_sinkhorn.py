# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Capsules with dynamic routing (squash, 5-D broadcast matmul, softmax over the routing dim,
agreement by einsum, detached routing iterations) and a Sinkhorn optimal-transport loss between
capsule poses and prototypes (cdist, logsumexp iterations), with a margin loss, a Cholesky-based
Gaussian log-likelihood regulariser (diag_embed, linalg.cholesky, cholesky_solve, logdet via
the diagonal) and RAdam (decoupled weight decay)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def squash(s, dim=-1):
    n2 = (s ** 2).sum(dim=dim, keepdim=True)
    return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)


class Capsules(nn.Module):
    def __init__(self, n_in=6, d_in=4, n_out=3, d_out=5, iters=3):
        super().__init__()
        self.W = nn.Parameter(0.1 * torch.randn(1, n_in, n_out, d_out, d_in))
        self.iters = iters

    def forward(self, u):
        u_hat = torch.matmul(self.W, u[:, :, None, :, None]).squeeze(-1)     # (B, in, out, d_out)
        b = torch.zeros(u_hat.shape[:3])
        for i in range(self.iters):
            c = F.softmax(b, dim=2)
            uh = u_hat if i == self.iters - 1 else u_hat.detach()
            v = squash((c.unsqueeze(-1) * uh).sum(dim=1))
            if i < self.iters - 1:
                b = b + torch.einsum("bioe,boe->bio", u_hat.detach(), v)
        return v


def sinkhorn(x, y, eps=0.1, iters=20):
    cost = torch.cdist(x, y) ** 2
    n, m = cost.shape
    log_mu, log_nu = torch.full((n,), -math.log(n)), torch.full((m,), -math.log(m))
    f, g = torch.zeros(n), torch.zeros(m)
    for _ in range(iters):
        f = eps * (log_mu - torch.logsumexp((g[None, :] - cost) / eps, dim=1))
        g = eps * (log_nu - torch.logsumexp((f[:, None] - cost) / eps, dim=0))
    plan = torch.exp((f[:, None] + g[None, :] - cost) / eps)
    return (plan * cost).sum()


def gaussian_nll(x, mean, raw_scale):
    cov = torch.diag_embed(F.softplus(raw_scale) + 0.1) + 0.05 * torch.ones(len(mean), len(mean))
    L = torch.linalg.cholesky(cov)
    diff = (x - mean).unsqueeze(-1)
    sol = torch.cholesky_solve(diff, L)
    logdet = 2 * torch.log(torch.diagonal(L)).sum()
    return 0.5 * ((diff * sol).sum() + logdet + len(mean) * math.log(2 * math.pi))


torch.manual_seed(0)
caps = Capsules()
proto = nn.Parameter(torch.randn(3, 5) * 0.5)
raw = nn.Parameter(torch.zeros(5))
model = nn.ModuleDict({"caps": caps})
model.register_parameter("proto", proto)
model.register_parameter("raw", raw)
opt = torch.optim.RAdam(model.parameters(), lr=5e-3, weight_decay=1e-2, decoupled_weight_decay=True)
u = torch.randn(4, 6, 4)
y = torch.tensor([0, 2, 1, 0])
LOSSES = []
for step in range(4):
    opt.zero_grad()
    v = caps(u)
    lengths = v.norm(dim=-1)
    onehot = F.one_hot(y, 3).float()
    margin = (onehot * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - onehot) * F.relu(lengths - 0.1) ** 2).sum(1).mean()
    ot = sinkhorn(v.reshape(-1, 5), proto)
    nll = gaussian_nll(v[:, 0].mean(0), proto.mean(0), raw)
    loss = margin + 0.1 * ot + 0.01 * nll
    loss.backward()
    opt.step()
    LOSSES.append(loss.item())
MODELS = {"model": model}
