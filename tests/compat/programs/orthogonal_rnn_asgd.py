# ruff: noqa: B007  (published-style loops keep their unused counters)
"""An orthogonal RNN on the adding problem (Arjovsky et al.; the expRNN / orthogonal-RNN repos'
setup): the recurrent weights of nn.RNN and of an nn.RNNCell are kept orthogonal by
nn.utils.parametrizations.orthogonal (matrix_exp and cayley maps; householder on the readout),
trained with ASGD, gradient clipping and a warm-up + step LR schedule. Halfway through, a
checkpoint (model, optimizer and scheduler state dicts) goes through torch.save / torch.load
into fresh objects that carry on; the run ends with Rprop fine-tuning of the readout."""
import io

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations, parametrize

SEQ, HIDDEN, BATCH = 12, 10, 16


def adding_batch(gen):
    values = torch.rand(BATCH, SEQ, generator=gen)
    markers = torch.zeros(BATCH, SEQ)
    first = torch.randint(0, SEQ // 2, (BATCH,), generator=gen)
    second = torch.randint(SEQ // 2, SEQ, (BATCH,), generator=gen)
    markers[torch.arange(BATCH), first] = 1.0
    markers[torch.arange(BATCH), second] = 1.0
    return torch.stack([values, markers], dim=-1), (values * markers).sum(1, keepdim=True)


class OrthoRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(2, HIDDEN, batch_first=True, nonlinearity="tanh")
        parametrizations.orthogonal(self.rnn, "weight_hh_l0", orthogonal_map="matrix_exp")
        self.cell = nn.RNNCell(HIDDEN, HIDDEN, nonlinearity="relu")
        parametrizations.orthogonal(self.cell, "weight_hh", orthogonal_map="cayley")
        self.proj = parametrizations.orthogonal(nn.Linear(HIDDEN, 6), orthogonal_map="householder")
        self.readout = nn.Linear(6, 1)

    def forward(self, x):
        out, h = self.rnn(x)
        hc = torch.zeros(x.shape[0], HIDDEN)
        for t in range(out.shape[1]):
            hc = self.cell(out[:, t], hc)
        return self.readout(torch.tanh(self.proj(hc + h[0])))


def make(model_state=None):
    model = OrthoRNN()
    opt = torch.optim.ASGD(model.parameters(), lr=0.05, lambd=1e-4, alpha=0.75, t0=4, weight_decay=1e-5)
    warmup = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=3)
    decay = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warmup, decay], milestones=[3])
    return model, opt, sched


def train_step(model, opt, sched, gen):
    x, y = adding_batch(gen)
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    opt.step()
    sched.step()
    return [loss.item(), float(norm), opt.param_groups[0]["lr"]]


torch.manual_seed(0)
gen = torch.Generator().manual_seed(7)
model, opt, sched = make()
LOSSES = []
for step in range(5):
    LOSSES += train_step(model, opt, sched, gen)
W = model.rnn.weight_hh_l0
LOSSES.append((W @ W.t() - torch.eye(HIDDEN)).abs().max().item() < 1e-5)

buf = io.BytesIO()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
buf.seek(0)
ckpt = torch.load(buf)
model, opt, sched = make()
model.load_state_dict(ckpt["model"])
opt.load_state_dict(ckpt["opt"])
sched.load_state_dict(ckpt["sched"])
LOSSES.append(sorted(ckpt["model"].keys()).index("rnn.parametrizations.weight_hh_l0.original"))
for step in range(5):
    LOSSES += train_step(model, opt, sched, gen)
# ASGD's running average of the weights (eval with the averaged copy, as the AWD-LSTM recipe)
LOSSES.append(sum(s["ax"].abs().sum().item() for s in opt.state.values()))

ft = torch.optim.Rprop(model.readout.parameters(), lr=0.01)
x, y = adding_batch(gen)
for step in range(3):
    ft.zero_grad()
    loss = F.smooth_l1_loss(model(x), y, beta=0.5)
    loss.backward()
    ft.step()
    LOSSES.append(loss.item())
with parametrize.cached():
    LOSSES.append(model(x).sum().item())
model.zero_grad()
F.mse_loss(model(x), y).backward()
MODELS = {"model": model}
