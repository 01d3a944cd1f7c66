# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A physics-informed network (Raissi et al.) for the 1-D Poisson problem -u'' = pi^2 sin(pi x)
on [0, 1] with u(0) = u(1) = 0, in the style of the PINN tutorials: the residual takes u' and u''
with autograd.grad(create_graph=True) on the collocation points; Adam warm-up, then L-BFGS with a
closure, then Rprop on a reweighted loss. Then the curvature tools of torch.autograd.functional:
jacobian of the network in x, hessian / hvp / vhp of the loss in the head's weights (checked
against each other), and a Gauss-Newton step built from jacobian(..., vectorize=True).
In float64, as PINN codes usually run (L-BFGS amplifies float32 rounding)."""
import math

import torch
import torch.nn as nn
from torch.autograd.functional import hessian, hvp, jacobian, jvp, vhp, vjp

DTYPE = torch.float64


class PINN(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.body(x))


def residual(model, x):
    x = x.clone().requires_grad_(True)
    u = model(x)
    du = torch.autograd.grad(u, x, grad_outputs=torch.ones_like(u), create_graph=True)[0]
    d2u = torch.autograd.grad(du, x, grad_outputs=torch.ones_like(du), create_graph=True)[0]
    return -d2u - math.pi ** 2 * torch.sin(math.pi * x)


def pinn_loss(model, x, bc_weight=10.0):
    bc = model(torch.tensor([[0.0], [1.0]], dtype=DTYPE))
    return residual(model, x).pow(2).mean() + bc_weight * bc.pow(2).mean()


torch.manual_seed(0)
model = PINN().to(DTYPE)
x_col = torch.rand(32, 1, dtype=DTYPE)
LOSSES = []
adam = torch.optim.Adam(model.parameters(), lr=5e-3)
for step in range(5):
    adam.zero_grad()
    loss = pinn_loss(model, x_col)
    loss.backward()
    adam.step()
    LOSSES.append(loss.item())

lbfgs = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=6, history_size=4, line_search_fn="strong_wolfe")


def closure():
    lbfgs.zero_grad()
    loss = pinn_loss(model, x_col)
    loss.backward()
    return loss


for it in range(2):
    LOSSES.append(lbfgs.step(closure).item())

rprop = torch.optim.Rprop(model.parameters(), lr=1e-3, etas=(0.5, 1.2), step_sizes=(1e-6, 0.05))
for step in range(4):
    rprop.zero_grad()
    loss = pinn_loss(model, x_col, bc_weight=20.0)
    loss.backward()
    rprop.step()
    LOSSES.append(loss.item())

# curvature of the loss in the head's weights, the rest of the network fixed
x_test = torch.linspace(0, 1, 9, dtype=DTYPE).unsqueeze(1)
feats = model.body(x_test).detach()
target = torch.sin(math.pi * x_test)


def head_loss(w, b):
    return ((feats @ w.t() + b - target) ** 2).mean() + 1e-3 * (w ** 2).sum()


w0, b0 = model.head.weight.detach().clone(), model.head.bias.detach().clone()
H = hessian(head_loss, (w0, b0))
v = (torch.randn_like(w0), torch.randn_like(b0))
_, Hv = hvp(head_loss, (w0, b0), v)
_, vH = vhp(head_loss, (w0, b0), v)
Hww = H[0][0].reshape(w0.numel(), w0.numel())
assert torch.allclose(Hv[0].flatten(), Hww @ v[0].flatten() + H[0][1].reshape(w0.numel(), -1) @ v[1], atol=1e-5)
assert torch.allclose(vH[0], Hv[0], atol=1e-5)
LOSSES += [Hww.trace().item(), H[1][1].item(), Hv[0].norm().item(), torch.linalg.eigvalsh(Hww)[-1].item()]

# Jacobian of the network output in x, and u'(x) from jvp / vjp
J = jacobian(lambda x: model(x).squeeze(1), x_test)
du_jvp = jvp(lambda x: model(x), x_test, torch.ones_like(x_test))[1]
du_vjp = vjp(lambda x: model(x).sum(), x_test)[1]
assert torch.allclose(J.sum(0), du_vjp, atol=1e-6) and torch.allclose(du_jvp, du_vjp, atol=1e-6)
LOSSES += [J.diagonal(dim1=0, dim2=1).sum().item(), du_jvp.abs().sum().item()]

# one damped Gauss-Newton step on the head (J of the residuals, vectorized)
def residuals(w, b):
    return (feats @ w.t() + b - target).squeeze(1)


Jw, Jb = jacobian(residuals, (w0, b0), vectorize=True)
Jfull = torch.cat([Jw.reshape(len(x_test), -1), Jb], dim=1)
r = residuals(w0, b0)
delta = torch.linalg.solve(Jfull.t() @ Jfull + 1e-2 * torch.eye(Jfull.shape[1], dtype=DTYPE), -Jfull.t() @ r)
with torch.no_grad():
    model.head.weight += delta[:-1].reshape_as(w0)
    model.head.bias += delta[-1:]
LOSSES += [r.pow(2).mean().item(), residuals(model.head.weight, model.head.bias).pow(2).mean().item()]
model.zero_grad()
pinn_loss(model, x_col).backward()
MODELS = {"pinn": model}
