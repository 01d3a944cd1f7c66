# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Polynomial regression with LBFGS (strong Wolfe line search) and a closure."""
import torch
import torch.nn.functional as F

POLY_DEGREE = 3


def make_features(x):
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE + 1)], 1)


torch.manual_seed(0)
W_target = torch.randn(POLY_DEGREE, 1) * 2
b_target = torch.randn(1) * 2


def f(x):
    return x.mm(W_target) + b_target.item()


x = make_features(torch.randn(64))
y = f(x) + 0.01 * torch.randn(64, 1)
fc = torch.nn.Linear(W_target.size(0), 1)
optimizer = torch.optim.LBFGS(fc.parameters(), lr=0.5, max_iter=8, history_size=5, line_search_fn="strong_wolfe")
LOSSES = []
for _ in range(4):
    def closure():
        optimizer.zero_grad()
        loss = F.smooth_l1_loss(fc(x), y)
        loss.backward()
        return loss
    LOSSES.append(optimizer.step(closure).item())
fc.zero_grad()
F.mse_loss(fc(x), y).backward()
MODELS = {"fc": fc}
