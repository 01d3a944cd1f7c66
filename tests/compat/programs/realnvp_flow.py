# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A RealNVP normalizing flow on a 2-D "two moons"-like toy density, in the style of the classic
PyTorch flow tutorials: alternating checkerboard masks registered as buffers, affine coupling layers
whose scale net ends in tanh (times a learnable per-dim scale), the log-determinant accumulated as a
sum of scales, an ActNorm layer with data-dependent initialisation on the first batch (an
initialised flag buffer, torch.no_grad .data.copy_), a torch.distributions.MultivariateNormal
base (scale_tril) and an Independent(Normal) check of the same log-density, the exact inverse
checked on samples, negative log-likelihood in bits per dim, Adam with clip_grad_norm_ and
ReduceLROnPlateau, and sampling through the inverse under torch.no_grad."""
import math

import torch
import torch.nn as nn
from torch import distributions


class CouplingLayer(nn.Module):
    def __init__(self, dim, hidden, mask):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                                 nn.LeakyReLU(0.2), nn.Linear(hidden, 2 * dim))
        self.scale = nn.Parameter(torch.zeros(dim))
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, x, reverse=False):
        x_masked = x * self.mask
        s, t = self.net(x_masked).chunk(2, dim=-1)
        s = self.scale * torch.tanh(s) * (1 - self.mask)
        t = t * (1 - self.mask)
        if not reverse:
            y = x_masked + (1 - self.mask) * (x * torch.exp(s) + t)
            return y, s.sum(dim=-1)
        y = x_masked + (1 - self.mask) * ((x - t) * torch.exp(-s))
        return y, -s.sum(dim=-1)


class ActNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.loc = nn.Parameter(torch.zeros(1, dim))
        self.log_scale = nn.Parameter(torch.zeros(1, dim))
        self.register_buffer("initialized", torch.tensor(0, dtype=torch.uint8))

    def forward(self, x, reverse=False):
        if not self.initialized.item() and not reverse:
            with torch.no_grad():
                self.loc.data.copy_(-x.mean(dim=0, keepdim=True))
                self.log_scale.data.copy_(-torch.log(x.std(dim=0, keepdim=True) + 1e-6))
                self.initialized.fill_(1)
        logdet = self.log_scale.sum().expand(x.shape[0])
        if not reverse:
            return (x + self.loc) * torch.exp(self.log_scale), logdet
        return x * torch.exp(-self.log_scale) - self.loc, -logdet


class RealNVP(nn.Module):
    def __init__(self, dim=2, hidden=32, n_layers=4):
        super().__init__()
        layers = [ActNorm(dim)]
        for i in range(n_layers):
            mask = torch.arange(dim).remainder(2).float()
            layers.append(CouplingLayer(dim, hidden, mask if i % 2 == 0 else 1 - mask))
        self.layers = nn.ModuleList(layers)
        self.register_buffer("base_loc", torch.zeros(dim))
        self.register_buffer("base_tril", torch.eye(dim))

    @property
    def base(self):
        return distributions.MultivariateNormal(self.base_loc, scale_tril=self.base_tril)

    def forward(self, x):
        log_det = torch.zeros(x.shape[0], device=x.device)
        for layer in self.layers:
            x, ld = layer(x)
            log_det = log_det + ld
        return x, log_det

    def inverse(self, z):
        for layer in reversed(self.layers):
            z, _ = layer(z, reverse=True)
        return z

    def log_prob(self, x):
        z, log_det = self(x)
        return self.base.log_prob(z) + log_det


def make_moons(n):
    theta = torch.rand(n) * math.pi
    upper = torch.rand(n) < 0.5
    x = torch.where(upper, torch.cos(theta), 1 - torch.cos(theta))
    y = torch.where(upper, torch.sin(theta), 0.5 - torch.sin(theta))
    return torch.stack([x, y], dim=1) + 0.1 * torch.randn(n, 2)


torch.manual_seed(17)
flow = RealNVP()
optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=1)
data = make_moons(64)

LOSSES = []
for step in range(5):
    batch = data[torch.randperm(64)[:32]]
    nll = -flow.log_prob(batch).mean()
    bpd = nll / (2 * math.log(2))
    optimizer.zero_grad()
    bpd.backward()
    torch.nn.utils.clip_grad_norm_(flow.parameters(), 5.0)
    optimizer.step()
    scheduler.step(bpd.item())
    LOSSES.append(bpd.item())

with torch.no_grad():
    z, _ = flow(data)
    recon = flow.inverse(z)
    LOSSES.append((recon - data).abs().max().item() * 1e3)
    indep = distributions.Independent(distributions.Normal(torch.zeros(2), torch.ones(2)), 1)
    LOSSES.append((indep.log_prob(z) - flow.base.log_prob(z)).abs().max().item())
    LOSSES.append(flow.base.entropy().item())
    samples = flow.inverse(flow.base.sample((16,)))
    LOSSES.append(samples.mean().item())
    LOSSES.append(flow.log_prob(samples).mean().item())
    LOSSES.append(flow.layers[0].loc.sum().item())
LOSSES.append(optimizer.param_groups[0]["lr"])
MODELS = {"flow": flow}
