# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A Dataset class, DataLoader with 2 worker processes, shuffling and a custom collate_fn."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class PairsDataset(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"features": self.x[i], "label": self.y[i]}


def collate(batch):
    return torch.stack([b["features"] for b in batch]), torch.stack([b["label"] for b in batch])


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
opt = torch.optim.RAdam(model.parameters(), lr=0.01)
loader = DataLoader(PairsDataset(40), batch_size=8, shuffle=True, num_workers=2, collate_fn=collate,
                    persistent_workers=True)
LOSSES = []
for epoch in range(2):
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        LOSSES.append(loss.item())
MODELS = {"mlp": model}
