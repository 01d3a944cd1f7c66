# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Extension points a research script leans on: a custom autograd.Function (save_for_backward,
needs_input_grad), activation checkpointing, forward-pre and full backward hooks, weight_norm and
spectral_norm parametrizations, packed variable-length sequences through an LSTM,
torch.func.functional_call, and a state_dict round trip through torch.save / torch.load."""
import io

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.checkpoint import checkpoint


class ScaledSwish(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        s = torch.sigmoid(beta * x)
        ctx.save_for_backward(x, s, beta)
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s, beta = ctx.saved_tensors
        gx = g * (s + beta * x * s * (1 - s)) if ctx.needs_input_grad[0] else None
        gb = (g * x * x * s * (1 - s)).sum().reshape(beta.shape) if ctx.needs_input_grad[1] else None
        return gx, gb


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(6, 8, batch_first=True)
        self.fc = parametrizations.weight_norm(nn.Linear(8, 8))
        self.sn = parametrizations.spectral_norm(nn.Linear(8, 8))
        self.beta = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(8, 2)

    def body(self, h):
        return ScaledSwish.apply(self.sn(self.fc(h)), self.beta)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        last = out[torch.arange(x.shape[0]), lengths - 1]
        return self.head(checkpoint(self.body, last, use_reentrant=False))


torch.manual_seed(0)
net = Net()
seen = {}
net.head.register_forward_pre_hook(lambda m, args: seen.__setitem__("pre", args[0].shape[0]))
net.head.register_full_backward_hook(lambda m, gin, gout: seen.__setitem__("gout", gout[0].abs().sum().item()))
opt = torch.optim.Adam(net.parameters(), lr=0.01)
x = torch.randn(5, 7, 6)
lengths = torch.tensor([7, 3, 5, 1, 6])
y = torch.tensor([0, 1, 1, 0, 1])
LOSSES = []
for step in range(3):
    opt.zero_grad()
    loss = F.cross_entropy(net(x, lengths), y)
    loss.backward()
    opt.step()
    LOSSES += [loss.item(), seen["gout"], float(seen["pre"])]
buf = io.BytesIO()
torch.save(net.state_dict(), buf)
buf.seek(0)
clone = Net()
clone.load_state_dict(torch.load(buf))
params = {k: v.detach() for k, v in clone.named_parameters()}
with torch.no_grad():
    LOSSES.append(torch.func.functional_call(net, params, (x, lengths)).sum().item())
    LOSSES.append(clone(x, lengths).sum().item())
MODELS = {"net": net}
