# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A message-passing graph network written with scatter ops: edge messages summed into nodes by
index_add_, attention by a segment softmax (scatter_reduce amax, exp, index_add), mean pooling per
graph with EmbeddingBag-style offsets, Huber loss, RMSprop and ReduceLROnPlateau."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class GNN(nn.Module):
    def __init__(self, d=16, types=5):
        super().__init__()
        self.emb = nn.EmbeddingBag(types, d, mode="mean")
        self.msg = nn.Linear(2 * d, d)
        self.att = nn.Linear(2 * d, 1)
        self.upd = nn.GRUCell(d, d)
        self.out = nn.Linear(d, 1)

    def forward(self, feats, offsets, src, dst, graph_of, n_graphs):
        h = self.emb(feats, offsets)
        for _ in range(2):
            pair = torch.cat([h[src], h[dst]], dim=1)
            m = torch.tanh(self.msg(pair))
            score = self.att(pair).squeeze(1)
            top = torch.full((h.shape[0],), -1e9).scatter_reduce(0, dst, score, reduce="amax", include_self=True)
            w = torch.exp(score - top[dst])
            denom = torch.zeros(h.shape[0]).index_add_(0, dst, w)
            agg = torch.zeros_like(h).index_add_(0, dst, m * (w / denom[dst]).unsqueeze(1))
            h = self.upd(agg, h)
        count = torch.bincount(graph_of, minlength=n_graphs).clamp(min=1).unsqueeze(1).float()
        pooled = torch.zeros(n_graphs, h.shape[1]).index_add_(0, graph_of, h) / count
        return self.out(pooled).squeeze(1)


torch.manual_seed(0)
n_nodes, n_graphs = 12, 3
graph_of = torch.tensor([0] * 4 + [1] * 5 + [2] * 3)
feats = torch.randint(0, 5, (20,))
offsets = torch.sort(torch.randperm(19)[:n_nodes - 1] + 1).values
offsets = torch.cat([torch.zeros(1, dtype=torch.long), offsets])
src = torch.tensor([0, 1, 2, 3, 1, 4, 5, 6, 7, 8, 5, 9, 10, 11, 10])
dst = torch.tensor([1, 2, 3, 0, 0, 5, 6, 7, 8, 4, 8, 10, 11, 9, 9])
y = torch.tensor([0.5, -1.0, 2.0])
model = GNN()
opt = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, momentum=0.5)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
LOSSES = []
for step in range(5):
    opt.zero_grad()
    pred = model(feats, offsets, src, dst, graph_of, n_graphs)
    loss = F.huber_loss(pred, y, delta=0.5)
    loss.backward()
    opt.step()
    sched.step(loss.item())
    LOSSES.append(loss.item())
LOSSES.append(opt.param_groups[0]["lr"])
MODELS = {"gnn": model}
