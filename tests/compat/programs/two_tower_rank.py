# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A two-tower retrieval model in the style of TorchRec's examples (holoflow has no sparse
gradients, so the tables are dense): user and item towers of nn.EmbeddingBag in its three modes
(sum with per_sample_weights, mean over 1-D indices + offsets, max with include_last_offset) and an
nn.Embedding for item ids, Adagrad on the embedding tables and AdamW on the dense MLPs (two
optimizers, as the recipe); a pairwise MarginRankingLoss over positive/negative scores, a listwise
softmax loss, in-batch hard negatives picked by torch.topk on a copy (to(copy=True)) of the score
matrix masked in place, and ranking metrics by argsort(stable=True) / nanquantile / kthvalue /
torch.quantile, searchsorted into the unsorted score rows through sorter=, bucketize into the
quantile bins; then a copy.deepcopy of the model fine-tuned with SGD and gradient accumulation."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

N_USERS, N_ITEMS, N_TAGS, D, B = 40, 30, 12, 8, 10


def bags(num_rows, batch, gen, max_len=4, min_len=1):
    lengths = torch.randint(min_len, max_len + 1, (batch,), generator=gen)
    idx = torch.randint(0, num_rows, (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return idx, offsets, lengths


class UserTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.history = nn.EmbeddingBag(N_ITEMS, D, mode="sum")
        self.profile = nn.EmbeddingBag(N_USERS, D, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(2 * D, 16), nn.ReLU(), nn.Linear(16, D))

    def forward(self, hist, hist_off, hist_w, prof, prof_off):
        h = self.history(hist, hist_off, per_sample_weights=hist_w)
        p = self.profile(prof, prof_off)
        return F.normalize(self.mlp(torch.cat([h, p], dim=1)), dim=1)


class ItemTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.ids = nn.Embedding(N_ITEMS, D)
        self.tags = nn.EmbeddingBag(N_TAGS, D, mode="max", include_last_offset=True, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(2 * D, 16), nn.Tanh(), nn.Linear(16, D))

    def forward(self, item, tags, tag_off):
        x = torch.cat([self.ids(item), self.tags(tags, tag_off)], dim=1)
        return F.normalize(self.mlp(x), dim=1)


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = UserTower()
        self.item = ItemTower()
        self.log_temp = nn.Parameter(torch.tensor(2.0))

    def forward(self, user_feats, item_feats):
        return self.user(*user_feats), self.item(*item_feats), self.log_temp.exp()


torch.manual_seed(0)
gen = torch.Generator().manual_seed(3)
model = TwoTower()
tables = [p for n, p in model.named_parameters() if n.endswith(("history.weight", "profile.weight", "ids.weight",
                                                               "tags.weight"))]
dense_params = [p for n, p in model.named_parameters() if all(p is not q for q in tables)]
table_opt = torch.optim.Adagrad(tables, lr=0.05, lr_decay=0.01)
dense_opt = torch.optim.AdamW(dense_params, lr=0.01, weight_decay=0.05)
rank_loss = nn.MarginRankingLoss(margin=0.2)

LOSSES = []
for step in range(5):
    hist, hist_off, _ = bags(N_ITEMS, B, gen)
    hist_w = torch.rand(hist.shape, generator=gen)
    prof, prof_off, _ = bags(N_USERS, B, gen, max_len=2, min_len=0)    # cold users: empty bags
    item = torch.randint(0, N_ITEMS, (B,), generator=gen)
    tags, tag_off, _ = bags(N_TAGS, B, gen, max_len=3, min_len=0)
    tag_off = torch.cat([tag_off, torch.tensor([tags.numel()])])
    u, v, temp = model((hist, hist_off, hist_w, prof, prof_off), (item, tags, tag_off))
    scores = u @ v.t() * temp                               # (B, B): the diagonal are the positives
    listwise = F.cross_entropy(scores, torch.arange(B))
    eye = torch.eye(B, dtype=torch.bool)
    negatives = scores.to(torch.float32, copy=True)        # a working copy to mask in place
    negatives.masked_fill_(eye, float("-inf"))
    hard_neg, hard_idx = negatives.topk(2, dim=1)
    pos = scores.diagonal()
    pairwise = rank_loss(pos.repeat_interleave(2), hard_neg.reshape(-1), torch.ones(2 * B))
    loss = listwise + pairwise
    table_opt.zero_grad()
    dense_opt.zero_grad()
    loss.backward()
    table_opt.step()
    dense_opt.step()
    with torch.no_grad():
        order = scores.argsort(dim=1, descending=True, stable=True)
        rank_of_pos = (order == torch.arange(B).unsqueeze(1)).float().argmax(dim=1)
        median_neg = scores.masked_fill(eye, float("nan")).nanquantile(0.5, dim=1)
        kth = scores.kthvalue(3, dim=1).values
        q = torch.quantile(pos, torch.tensor([0.1, 0.5, 0.9]), interpolation="linear")
        # how many scores of its row each positive beats, searched in the unsorted rows via sorter
        col = pos.contiguous().unsqueeze(1)
        beaten = torch.searchsorted(scores, col, sorter=scores.argsort(dim=1), side="right")
        bins = torch.bucketize(col, q)                          # the positives' quantile bins
        above = torch.searchsorted(q, 2.5)                      # a number searched in a 1-D sequence
    LOSSES += [loss.item(), pairwise.item(), (1.0 / (rank_of_pos.float() + 1)).mean().item(),
               median_neg.mean().item(), kth.sum().item(), *q.tolist(), float(hard_idx.sum()),
               float(beaten.sum()), float(bins.sum()), float(above)]

# a copy adapted to a new region: plain SGD with gradient accumulation over two micro-batches
# (zero_grad after each step, so the copy's first backward finds whatever .grad it came with)
regional = copy.deepcopy(model)
ft_opt = torch.optim.SGD(regional.parameters(), lr=0.05, momentum=0.9)
for micro in range(5):     # (the last micro-batch's gradients stay, for the comparison)
    hist, hist_off, _ = bags(N_ITEMS, B, gen)
    prof, prof_off, _ = bags(N_USERS, B, gen, max_len=2, min_len=0)
    item = torch.randint(0, N_ITEMS, (B,), generator=gen)
    tags, tag_off, _ = bags(N_TAGS, B, gen, max_len=3, min_len=0)
    tag_off = torch.cat([tag_off, torch.tensor([tags.numel()])])
    u, v, temp = regional((hist, hist_off, None, prof, prof_off), (item, tags, tag_off))
    loss = F.cross_entropy(u @ v.t() * temp, torch.arange(B)) / 2
    loss.backward()
    if micro % 2 == 1:
        ft_opt.step()
        ft_opt.zero_grad()
    LOSSES.append(loss.item())
MODELS = {"model": model, "regional": regional}
