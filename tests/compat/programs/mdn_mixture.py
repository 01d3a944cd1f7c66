# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A mixture density network (Bishop 1994; the MDN tutorials' inverse-sine problem): an MLP emits
the logits, means and scales of a Gaussian mixture over a 2-D target, the loss is the negative
log-likelihood of torch.distributions.MixtureSameFamily(Categorical, Independent(Normal)),
trained with AdamW and a cosine schedule; then sampling, the mixture's mean / variance / cdf of
a 1-D mixture, the mixing distribution's entropy, and a KL between two diagonal Gaussians."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical, Independent, MixtureSameFamily, Normal, kl_divergence

K, D = 4, 2


class MDN(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.logits = nn.Linear(hidden, K)
        self.mu = nn.Linear(hidden, K * D)
        self.log_sigma = nn.Linear(hidden, K * D)

    def forward(self, x):
        h = self.body(x)
        mu = self.mu(h).view(-1, K, D)
        sigma = F.softplus(self.log_sigma(h)).view(-1, K, D) + 1e-3
        mix = Categorical(logits=self.logits(h))
        return MixtureSameFamily(mix, Independent(Normal(mu, sigma), 1))


def make_data(n, gen):
    # the inverse problem: x = y + 0.3 sin(2 pi y) + noise, predict y (and a second target) from x
    y = torch.rand(n, 1, generator=gen)
    x = y + 0.3 * torch.sin(2 * math.pi * y) + 0.05 * torch.randn(n, 1, generator=gen)
    return x, torch.cat([y, torch.cos(3 * y)], dim=1)


torch.manual_seed(0)
gen = torch.Generator().manual_seed(3)
x, y = make_data(64, gen)
model = MDN()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1e-2)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=8, eta_min=1e-3)
LOSSES = []
for epoch in range(8):
    for xb, yb in zip(x.split(16), y.split(16)):
        opt.zero_grad()
        nll = -model(xb).log_prob(yb).mean()
        nll.backward()
        opt.step()
    sched.step()
    LOSSES.append(nll.item())

with torch.no_grad():
    dist = model(x[:8])
    samples = dist.sample((5,))
    LOSSES += [samples.shape[0] * 1.0, dist.log_prob(samples).mean().item()]
    LOSSES += [dist.mean.sum().item(), dist.variance.sum().item()]
    LOSSES.append(dist.mixture_distribution.entropy().mean().item())
    LOSSES.append(dist.component_distribution.base_dist.stddev.mean().item())
    # a 1-D mixture (the first coordinate): its cdf at the targets
    comp = dist.component_distribution.base_dist
    mix1 = MixtureSameFamily(dist.mixture_distribution, Normal(comp.loc[..., 0], comp.scale[..., 0]))
    LOSSES.append(mix1.cdf(y[:8, 0]).sum().item())
    p = Independent(Normal(comp.loc[:, 0], comp.scale[:, 0]), 1)
    q = Independent(Normal(comp.loc[:, 1], comp.scale[:, 1]), 1)
    LOSSES.append(kl_divergence(p, q).sum().item())
opt.zero_grad()
(-model(x).log_prob(y).mean()).backward()
MODELS = {"mdn": model}
