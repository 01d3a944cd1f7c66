# ruff: noqa: B007  (published-style loops keep their unused counters)
"""DP-SGD with per-sample gradients from torch.func: functional_call over the module's
parameters, grad of the per-example loss, vmap over the batch; each example's gradient clipped
to a norm bound, summed, noised and written into .grad before an SGD step."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(5, 6)
y = torch.tensor([0, 2, 1, 1, 0])
noise = [torch.randn(p.shape) for p in model.parameters()]


def example_loss(params, buffers, xi, yi):
    out = functional_call(model, (params, buffers), (xi.unsqueeze(0),))
    return F.cross_entropy(out, yi.unsqueeze(0))


LOSSES = []
clip = 0.5
for step in range(3):
    params = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    grads = vmap(grad(example_loss), in_dims=(None, None, 0, 0))(params, buffers, x, y)
    norms = torch.stack([g.reshape(g.shape[0], -1).norm(dim=1) for g in grads.values()]).norm(dim=0)
    scale = (clip / (norms + 1e-6)).clamp(max=1.0)
    for (name, p), n in zip(model.named_parameters(), noise):
        g = grads[name]
        clipped = (g * scale.view(-1, *([1] * (g.dim() - 1)))).sum(0)
        p.grad = (clipped + 0.01 * n) / x.shape[0]
    opt.step()
    with torch.no_grad():
        LOSSES.append(F.cross_entropy(model(x), y).item())
    LOSSES.append(float(norms.sum()))
MODELS = {"net": model}
