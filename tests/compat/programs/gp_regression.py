# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Exact Gaussian-process regression trained by the marginal likelihood, in the style of GPyTorch's
"simple GP regression" written in plain torch (float64): positive hyperparameters as softplus of raw
nn.Parameters, an RBF + periodic (ARD) kernel from torch.cdist and a scaled squared distance, jitter
on the diagonal, the Cholesky factor through torch.linalg.cholesky_ex (info checked), alpha from
torch.cholesky_solve, the log-determinant from the factor's diagonal, the same negative marginal
log-likelihood via torch.distributions.MultivariateNormal(scale_tril=...), torch.linalg.slogdet and
torch.logdet as checks, a posterior mean/variance with torch.linalg.solve_triangular, torch.linalg.eigvalsh
of the kernel matrix, and Adam then LBFGS steps on the hyperparameters."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ExactGP(nn.Module):
    def __init__(self, train_x, train_y):
        super().__init__()
        self.train_x, self.train_y = train_x, train_y
        d = train_x.shape[-1]
        self.raw_lengthscale = nn.Parameter(torch.zeros(d, dtype=torch.float64))
        self.raw_outputscale = nn.Parameter(torch.tensor(0.0, dtype=torch.float64))
        self.raw_period = nn.Parameter(torch.tensor(1.0, dtype=torch.float64))
        self.raw_noise = nn.Parameter(torch.tensor(-2.0, dtype=torch.float64))
        self.mean_constant = nn.Parameter(torch.tensor(0.0, dtype=torch.float64))

    @property
    def lengthscale(self):
        return F.softplus(self.raw_lengthscale)

    @property
    def noise(self):
        return F.softplus(self.raw_noise) + 1e-4

    def kernel(self, x1, x2):
        ls = self.lengthscale
        rbf = torch.exp(-0.5 * torch.cdist(x1 / ls, x2 / ls).pow(2))
        diff = (x1[:, None, :] - x2[None, :, :]).abs().sum(-1)
        periodic = torch.exp(-2.0 * torch.sin(math.pi * diff / F.softplus(self.raw_period)).pow(2))
        return F.softplus(self.raw_outputscale) * rbf * periodic

    def nmll(self):
        n = self.train_x.shape[0]
        K = self.kernel(self.train_x, self.train_x) + (self.noise + 1e-6) * torch.eye(n, dtype=torch.float64)
        L, info = torch.linalg.cholesky_ex(K)
        assert int(info) == 0
        resid = (self.train_y - self.mean_constant).unsqueeze(-1)
        alpha = torch.cholesky_solve(resid, L)
        logdet = 2.0 * torch.log(torch.diagonal(L)).sum()
        nmll = 0.5 * (resid * alpha).sum() + 0.5 * logdet + 0.5 * n * math.log(2 * math.pi)
        return nmll / n, K, L

    def predict(self, test_x):
        _, K, L = self.nmll()
        Ks = self.kernel(test_x, self.train_x)
        v = torch.linalg.solve_triangular(L, Ks.t(), upper=False)
        alpha = torch.cholesky_solve((self.train_y - self.mean_constant).unsqueeze(-1), L)
        mean = self.mean_constant + (Ks @ alpha).squeeze(-1)
        var = F.softplus(self.raw_outputscale) - v.pow(2).sum(0)
        return mean, var


torch.manual_seed(9)
train_x = torch.rand(14, 2, dtype=torch.float64) * 4
train_y = torch.sin(train_x[:, 0] * 1.5) + 0.3 * torch.cos(train_x[:, 1] * 3) + 0.05 * torch.randn(14, dtype=torch.float64)
model = ExactGP(train_x, train_y)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)

LOSSES = []
for i in range(4):
    optimizer.zero_grad()
    loss, K, L = model.nmll()
    loss.backward()
    optimizer.step()
    mvn = torch.distributions.MultivariateNormal(model.mean_constant.expand(14), scale_tril=L)
    sign, logabsdet = torch.linalg.slogdet(K)
    LOSSES.extend([loss.item(), (-mvn.log_prob(train_y) / 14).item(), logabsdet.item(), sign.item(),
                   torch.logdet(K).item()])

lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5)


def closure():
    lbfgs.zero_grad()
    loss = model.nmll()[0]
    loss.backward()
    return loss


for i in range(2):
    LOSSES.append(lbfgs.step(closure).item())

test_x = torch.linspace(0, 4, 6, dtype=torch.float64).unsqueeze(-1).repeat(1, 2)
with torch.no_grad():
    mean, var = model.predict(test_x)
    LOSSES.extend(mean.tolist() + var.clamp(min=0).tolist())
    LOSSES.extend(torch.linalg.eigvalsh(model.nmll()[1])[-3:].tolist())
    LOSSES.extend(model.lengthscale.tolist() + [model.noise.item()])
# the compared gradients: one more marginal-likelihood backward through the distribution
model.zero_grad()
_, K, L = model.nmll()
(-torch.distributions.MultivariateNormal(model.mean_constant.expand(14), covariance_matrix=K).log_prob(train_y)).backward()
MODELS = {"gp": model}
