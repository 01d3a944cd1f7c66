# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Training interrupted and resumed from a checkpoint in memory: model, optimizer (Adagrad with
a second param group added by add_param_group) and scheduler (CosineAnnealingWarmRestarts) state
dicts saved with torch.save to a BytesIO and loaded into fresh objects with torch.load; an
EmbeddingBag (sum, per_sample_weights, padding_idx) and a buffer updated in place under no_grad."""
import io

import torch
import torch.nn as nn
import torch.nn.functional as F


class Recommender(nn.Module):
    def __init__(self, items=20, d=8):
        super().__init__()
        self.bag = nn.EmbeddingBag(items, d, mode="sum", padding_idx=0)
        self.user = nn.Embedding(5, d)
        self.head = nn.Linear(2 * d, 1)
        self.register_buffer("seen", torch.zeros(items))

    def forward(self, users, items, offsets, weights):
        with torch.no_grad():
            self.seen.index_add_(0, items, torch.ones_like(items, dtype=torch.float32))
        h = torch.cat([self.bag(items, offsets, per_sample_weights=weights), self.user(users)], dim=1)
        return self.head(h).squeeze(-1)


def build():
    model = Recommender()
    opt = torch.optim.Adagrad([{"params": model.bag.parameters()}], lr=0.1, initial_accumulator_value=0.1)
    opt.add_param_group({"params": list(model.user.parameters()) + list(model.head.parameters()), "lr": 0.05})
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=2, eta_min=1e-3)
    return model, opt, sched


torch.manual_seed(0)
users = torch.tensor([0, 3, 1, 4])
items = torch.randint(0, 20, (11,))
offsets = torch.tensor([0, 3, 5, 8])
weights = torch.rand(11)
clicks = torch.tensor([1.0, 0.0, 1.0, 0.0])
model, opt, sched = build()
LOSSES = []


def train(model, opt, sched, steps):
    for step in range(steps):
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(users, items, offsets, weights), clicks)
        loss.backward()
        opt.step()
        sched.step()
        LOSSES.append(loss.item())


train(model, opt, sched, 3)
buf = io.BytesIO()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
buf.seek(0)
ckpt = torch.load(buf)
model2, opt2, sched2 = build()
model2.load_state_dict(ckpt["model"])
opt2.load_state_dict(ckpt["opt"])
sched2.load_state_dict(ckpt["sched"])
train(model2, opt2, sched2, 3)
LOSSES.append(float(model2.seen.sum()))
LOSSES.append(opt2.param_groups[1]["lr"])
MODELS = {"recommender": model2}
