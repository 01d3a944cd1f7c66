# ruff: noqa: B007  (published-style loops keep their unused counters)
"""PointNet++-style set abstraction: farthest point sampling by an argmax loop, ball grouping
with cdist and topk(largest=False), gather of neighbourhoods with expand, a shared MLP as
Conv2d 1x1, max over neighbours, label smoothing cross entropy, AdamW and a OneCycleLR schedule."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def farthest_point_sample(xyz, m):
    b, n, _ = xyz.shape
    idx = torch.zeros(b, m, dtype=torch.long)
    dist = torch.full((b, n), 1e10)
    far = torch.zeros(b, dtype=torch.long)
    batch = torch.arange(b)
    for i in range(m):
        idx[:, i] = far
        c = xyz[batch, far, :].view(b, 1, 3)
        d = ((xyz - c) ** 2).sum(-1)
        dist = torch.minimum(dist, d)
        far = dist.argmax(-1)
    return idx


def group(xyz, feats, centers_idx, k):
    b = xyz.shape[0]
    centers = torch.gather(xyz, 1, centers_idx.unsqueeze(-1).expand(-1, -1, 3))
    d = torch.cdist(centers, xyz)
    nn_idx = d.topk(k, dim=-1, largest=False).indices
    flat = nn_idx.reshape(b, -1)
    pts = torch.gather(xyz, 1, flat.unsqueeze(-1).expand(-1, -1, 3)).view(b, -1, k, 3)
    local = pts - centers.unsqueeze(2)
    f = torch.gather(feats, 1, flat.unsqueeze(-1).expand(-1, -1, feats.shape[-1])).view(b, -1, k, feats.shape[-1])
    return centers, torch.cat([local, f], dim=-1)


class SetAbstraction(nn.Module):
    def __init__(self, cin, cout, m, k):
        super().__init__()
        self.m, self.k = m, k
        self.mlp = nn.Sequential(nn.Conv2d(cin + 3, cout, 1), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 1))

    def forward(self, xyz, feats):
        idx = farthest_point_sample(xyz, self.m)
        centers, g = group(xyz, feats, idx, self.k)
        h = self.mlp(g.permute(0, 3, 1, 2))
        return centers, h.max(dim=-1)[0].transpose(1, 2)


class PointNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.sa1 = SetAbstraction(1, 16, 8, 4)
        self.sa2 = SetAbstraction(16, 32, 4, 3)
        self.fc = nn.Sequential(nn.Linear(32, 16), nn.Dropout(0.0), nn.LeakyReLU(0.1), nn.Linear(16, classes))

    def forward(self, xyz):
        feats = xyz.norm(dim=-1, keepdim=True)
        xyz, f = self.sa1(xyz, feats)
        xyz, f = self.sa2(xyz, f)
        return self.fc(f.amax(dim=1))


torch.manual_seed(0)
model = PointNet()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05, amsgrad=True)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=6)
clouds = torch.randn(3, 24, 3)
labels = torch.tensor([0, 3, 1])
LOSSES = []
for step in range(5):
    opt.zero_grad(set_to_none=True)
    logits = model(clouds)
    loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
LOSSES.append(sched.get_last_lr()[0])
MODELS = {"pointnet": model}
