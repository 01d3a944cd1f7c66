# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A scientific-ML style script in double precision: torch.set_default_dtype(torch.float64) before
the model is built (layers, factories and data follow it), dropout inside activation-checkpointed
blocks (torch.utils.checkpoint with preserve_rng_state, reentrant and not, and
checkpoint_sequential: the recomputation must draw the same masks), gradient accumulation over
micro-batches with the loss divided by their count and zero_grad every few steps, an explicit
torch.random.fork_rng region that must leave the global stream untouched, and
torch.linalg.eigh / torch.linalg.solve / torch.cdist in the loss. The default dtype is restored
at the end."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

torch.set_default_dtype(torch.float64)


class NoisyBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return x + self.drop(torch.tanh(self.fc(x)))


class Net(nn.Module):
    def __init__(self, d=6):
        super().__init__()
        self.a, self.b = NoisyBlock(d), NoisyBlock(d)
        self.tail = nn.Sequential(NoisyBlock(d), NoisyBlock(d), NoisyBlock(d))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        x = checkpoint(self.a, x, use_reentrant=False, preserve_rng_state=True)
        x = checkpoint(self.b, x, use_reentrant=True, preserve_rng_state=True)
        x = checkpoint_sequential(self.tail, 2, x, use_reentrant=False)
        return self.head(x)


torch.manual_seed(0)
model = Net()
assert model.head.weight.dtype == torch.float64
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
anchors = torch.randn(4, 3)

LOSSES = []
accum = 2
for step in range(7):                           # (the last backward's gradients stay for the harness)
    x = torch.randn(5, 6)
    y = torch.randint(0, 3, (5,))
    out = model(x)
    # a symmetric "metric" from the outputs: its eigenvalues and a solve keep the loss smooth
    gram = out.T @ out / out.shape[0] + torch.eye(3)
    evals = torch.linalg.eigh(gram).eigenvalues
    sol = torch.linalg.solve(gram, torch.ones(3))
    dist = torch.cdist(out, anchors).min(dim=1).values.mean()
    loss = F.cross_entropy(out, y) + 0.01 * evals.log().sum() + 0.01 * sol.norm() + 0.05 * dist
    (loss / accum).backward()
    if (step + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
    with torch.random.fork_rng():
        torch.manual_seed(123)
        _ = torch.rand(3)                      # draws that must not move the stream outside
    LOSSES.append(loss.item())
LOSSES.append(float(torch.rand(())))           # the global stream after every draw above

torch.set_default_dtype(torch.float32)
MODELS = {"net": model}
