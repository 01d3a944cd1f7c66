# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Second-order MAML (Finn et al.) on synthetic few-shot classification, in the style of
learn2learn / higher: the inner loop adapts fast weights with autograd.grad(create_graph=True)
and torch.func.functional_call, so the outer Adam step differentiates through the inner SGD
steps (double backward of linear, LayerNorm, BatchNorm in training mode, GELU, cross_entropy
with label smoothing, and log_softmax + class-weighted nll_loss); then functorch's MAML form:
vmap over tasks of torch.func.grad through the inner step."""
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

N_WAY, K_SHOT, K_QUERY, DIM = 3, 4, 5, 10
INNER_STEPS, INNER_LR = 2, 0.4


class Learner(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(DIM, 16)
        self.ln = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 16)
        self.bn = nn.BatchNorm1d(16, track_running_stats=False)
        self.head = nn.Linear(16, N_WAY)

    def forward(self, x):
        h = F.gelu(self.ln(self.fc1(x)))
        h = torch.tanh(self.bn(self.fc2(h)))
        return self.head(h)


def sample_task(gen):
    centers = torch.randn(N_WAY, DIM, generator=gen) * 1.5
    def draw(k):
        y = torch.arange(N_WAY).repeat_interleave(k)
        x = centers[y] + 0.7 * torch.randn(N_WAY * k, DIM, generator=gen)
        return x, y
    return draw(K_SHOT), draw(K_QUERY)


def adapt(model, params, x, y):
    for _ in range(INNER_STEPS):
        logits = functional_call(model, params, (x,))
        loss = F.cross_entropy(logits, y, label_smoothing=0.1)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        params = OrderedDict((name, p - INNER_LR * g) for (name, p), g in zip(params.items(), grads))
    return params


torch.manual_seed(0)
CLASS_WEIGHT = torch.tensor([1.0, 0.5, 2.0])
gen = torch.Generator().manual_seed(1234)
model = Learner()
meta_opt = torch.optim.Adam(model.parameters(), lr=3e-3)
LOSSES = []
for outer in range(4):
    meta_opt.zero_grad()
    total, correct = 0.0, 0
    for task in range(2):
        (xs, ys), (xq, yq) = sample_task(gen)
        fast = adapt(model, OrderedDict(model.named_parameters()), xs, ys)
        logits = functional_call(model, fast, (xq,))
        qloss = F.nll_loss(F.log_softmax(logits, dim=1), yq, weight=CLASS_WEIGHT)
        (qloss / 2).backward()
        total += qloss.item()
        correct += (logits.argmax(dim=1) == yq).sum().item()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5.0)
    meta_opt.step()
    LOSSES += [total / 2, float(gnorm)]
# first-order check: the full second-order meta-gradient differs from the first-order one
(xs, ys), (xq, yq) = sample_task(gen)
params = OrderedDict(model.named_parameters())
fast = adapt(model, params, xs, ys)
qloss = F.cross_entropy(functional_call(model, fast, (xq,)), yq)
meta_grads = torch.autograd.grad(qloss, list(params.values()), retain_graph=True)
fo_grads = torch.autograd.grad(qloss, list(fast.values()))
LOSSES.append(sum((a - b).pow(2).sum() for a, b in zip(meta_grads, fo_grads)).item())
model.zero_grad()
qloss = F.cross_entropy(functional_call(model, adapt(model, params, xs, ys), (xq,)), yq)
qloss.backward()
LOSSES.append(qloss.item())


# functorch's MAML: a batch of tasks at once, the inner step with torch.func.grad. No norm layers
# here: torch 2.13's vmap gets the second derivative through BatchNorm (training) and LayerNorm
# wrong (it differs from the same tasks run in a loop, which holoflow's vmap matches)
class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, 16), nn.SiLU(), nn.Linear(16, 16), nn.Softplus(), nn.Linear(16, N_WAY))

    def forward(self, x):
        return self.net(x)


mlp = Mlp()
mlp_opt = torch.optim.SGD(mlp.parameters(), lr=0.1, momentum=0.9, nesterov=True)


def task_loss(params, x, y):
    return F.cross_entropy(functional_call(mlp, params, (x,)), y)


def query_loss(params, xs, ys, xq, yq):
    g = grad(task_loss)(params, xs, ys)
    fast = {k: p - INNER_LR * g[k] for k, p in params.items()}
    return task_loss(fast, xq, yq)


for step in range(3):
    tasks = [sample_task(gen) for _ in range(3)]
    xs, ys, xq, yq = (torch.stack([t[i][j] for t in tasks]) for i in (0, 1) for j in (0, 1))
    mlp_opt.zero_grad()
    losses = vmap(query_loss, in_dims=(None, 0, 0, 0, 0))(dict(mlp.named_parameters()), xs, ys, xq, yq)
    losses.mean().backward()
    mlp_opt.step()
    LOSSES += losses.tolist()
MODELS = {"learner": model, "mlp": mlp}
