# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A graph convolution on a normalized adjacency built by index_put_ with accumulate (holoflow has
no sparse tensors: torch.sparse_coo_tensor is refused by name) whose node features come from image patches (F.unfold, then F.fold to rebuild
an image for a reconstruction loss), positions bucketized by torch.bucketize against
searchsorted edges, a cumsum-based prefix pooling, NAdam and ExponentialLR."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def normalized_adjacency(edges, n):
    src, dst = edges
    idx = torch.cat([torch.stack([src, dst]), torch.stack([dst, src]), torch.arange(n).repeat(2, 1)], dim=1)
    adj = torch.zeros(n, n).index_put_((idx[0], idx[1]), torch.ones(idx.shape[1]), accumulate=True)
    r = adj.sum(dim=1).pow(-0.5)
    return r.unsqueeze(1) * adj * r.unsqueeze(0)


class PatchGCN(nn.Module):
    def __init__(self, patch=2, d=12):
        super().__init__()
        self.patch = patch
        self.inp = nn.Linear(patch * patch, d)
        self.g1 = nn.Linear(d, d)
        self.g2 = nn.Linear(d, patch * patch)
        self.pos = nn.Embedding(4, d)

    def forward(self, img, adj, buckets):
        cols = F.unfold(img, kernel_size=self.patch, stride=self.patch)      # (1, p*p, L)
        x = self.inp(cols[0].t()) + self.pos(buckets)
        x = F.relu(adj @ self.g1(x))
        prefix = torch.cumsum(x, dim=0) / torch.arange(1, x.shape[0] + 1).unsqueeze(1)
        out = self.g2(x + prefix)
        return F.fold(out.t().unsqueeze(0), img.shape[-2:], kernel_size=self.patch, stride=self.patch)


torch.manual_seed(0)
img = torch.rand(1, 1, 6, 6)
n = 9
edges = (torch.tensor([0, 1, 3, 4, 6, 7, 0, 1, 2, 3, 4, 5]), torch.tensor([1, 2, 4, 5, 7, 8, 3, 4, 5, 6, 7, 8]))
adj = normalized_adjacency(edges, n)
centers = torch.rand(n)
bounds = torch.tensor([0.25, 0.5, 0.75])
buckets = torch.bucketize(centers, bounds)
assert torch.equal(buckets, torch.searchsorted(bounds, centers))
model = PatchGCN()
opt = torch.optim.NAdam(model.parameters(), lr=5e-3)
sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
LOSSES = []
for step in range(4):
    opt.zero_grad()
    rec = model(img, adj, buckets)
    loss = F.mse_loss(rec, img) + 0.1 * F.smooth_l1_loss(rec, img, beta=0.5)
    loss.backward()
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
MODELS = {"gcn": model}
