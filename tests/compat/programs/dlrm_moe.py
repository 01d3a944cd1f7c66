# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A DLRM-style click-through model with a mixture-of-experts top MLP: sparse features through
nn.EmbeddingBag (mode='sum', flat indices + offsets, per-sample weights) kept in an nn.ModuleDict,
a multi-hot history feature as a padded 2-D batch (mode='mean', padding_idx) and a
"max" bag with include_last_offset, a bottom MLP on dense features, pairwise dot interactions (bmm + triu_indices), a top-k gated
mixture of experts (torch.topk, scatter, gather, einsum over stacked expert weights) with a
load-balancing loss and a Gumbel-softmax router auxiliary, register_buffer statistics,
BCEWithLogitsLoss with pos_weight, Adagrad, a torch.no_grad eval pass, and a checkpoint round trip
through io.BytesIO (model + optimizer state_dict into a fresh model) before training continues."""
import io

import torch
import torch.nn as nn
import torch.nn.functional as F


class MoE(nn.Module):
    def __init__(self, dim, hidden, num_experts=4, k=2):
        super().__init__()
        self.k, self.num_experts = k, num_experts
        self.gate = nn.Linear(dim, num_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(num_experts, dim, hidden) * dim ** -0.5)
        self.b1 = nn.Parameter(torch.zeros(num_experts, hidden))
        self.w2 = nn.Parameter(torch.randn(num_experts, hidden, dim) * hidden ** -0.5)
        self.register_buffer("expert_counts", torch.zeros(num_experts))

    def forward(self, x):
        logits = self.gate(x)                                          # (B, E)
        top_vals, top_idx = torch.topk(logits, self.k, dim=-1)        # (B, k)
        top_w = F.softmax(top_vals, dim=-1)
        gates = torch.zeros_like(logits).scatter(1, top_idx, top_w)   # sparse (B, E)
        h = F.gelu(torch.einsum("bd,edh->beh", x, self.w1) + self.b1)
        y = torch.einsum("beh,ehd->bed", h, self.w2)                  # every expert, dense
        out = torch.einsum("be,bed->bd", gates, y)
        # the chosen experts' outputs, gathered, agree with the weighted sum
        chosen = torch.gather(y, 1, top_idx.unsqueeze(-1).expand(-1, -1, y.size(-1)))
        out_check = (top_w.unsqueeze(-1) * chosen).sum(dim=1)
        if self.training:
            with torch.no_grad():
                self.expert_counts += F.one_hot(top_idx, self.num_experts).sum(dim=(0, 1)).float()
        probs = F.softmax(logits, dim=-1)
        load = F.one_hot(top_idx[:, 0], self.num_experts).float().mean(dim=0)
        aux = self.num_experts * (probs.mean(dim=0) * load).sum()
        return out, aux, (out - out_check).abs().max()


class DLRM(nn.Module):
    def __init__(self, dense_dim=5, emb_dim=8, tables=(("user", 30), ("item", 40), ("ctx", 12))):
        super().__init__()
        self.embeddings = nn.ModuleDict({name: nn.EmbeddingBag(n, emb_dim, mode="sum") for name, n in tables})
        self.history = nn.EmbeddingBag(25, emb_dim, mode="mean", padding_idx=0)
        self.tags = nn.EmbeddingBag(15, emb_dim, mode="max", include_last_offset=True)
        self.bottom = nn.Sequential(nn.Linear(dense_dim, 16), nn.ReLU(), nn.Linear(16, emb_dim), nn.ReLU())
        n_feat = len(tables) + 3
        li, lj = torch.triu_indices(n_feat, n_feat, offset=1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.register_buffer("dense_mean", torch.zeros(dense_dim))
        top_in = emb_dim + n_feat * (n_feat - 1) // 2
        self.proj = nn.Linear(top_in, 16)
        self.moe = MoE(16, 24)
        self.head = nn.Linear(16, 1)
        self.router_temp = nn.Linear(16, 3)

    def forward(self, dense, sparse, history, tags):
        if self.training:
            with torch.no_grad():
                self.dense_mean.mul_(0.9).add_(dense.mean(dim=0), alpha=0.1)
        x = self.bottom(dense - self.dense_mean)
        embs = [self.embeddings[name](idx, offsets, per_sample_weights=w) for name, (idx, offsets, w) in sparse.items()]
        embs += [self.history(history), self.tags(*tags)]
        feats = torch.stack([x] + embs, dim=1)                        # (B, F, D)
        inter = torch.bmm(feats, feats.transpose(1, 2))[:, self.li, self.lj]
        z = F.relu(self.proj(torch.cat([x, inter], dim=1)))
        moe_out, aux, check = self.moe(z)
        z = z + moe_out
        return self.head(z).squeeze(-1), aux, check, self.router_temp(z)


def make_bags(num_rows, batch, gen_lengths):
    lengths = gen_lengths
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    idx = torch.randint(0, num_rows, (int(lengths.sum()),))
    weights = torch.rand(int(lengths.sum())) + 0.5
    return idx, offsets, weights


torch.manual_seed(21)
model = DLRM()
batch = 6
dense = torch.randn(batch, 5) * 2 + 1
sparse = {
    "user": make_bags(30, batch, torch.tensor([1, 2, 1, 3, 1, 2])),
    "item": make_bags(40, batch, torch.tensor([2, 1, 0, 2, 3, 1])),        # an empty bag sums to zeros
    "ctx": make_bags(12, batch, torch.tensor([1, 1, 1, 1, 1, 1])),
}
history = torch.randint(1, 25, (batch, 4))
history[0, 2:] = 0                                                           # padded histories
history[3, 1:] = 0
tags = (torch.randint(0, 15, (10,)), torch.tensor([0, 2, 3, 5, 6, 8, 10]))   # last offset closes the final bag
clicks = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
criterion = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(2.0))
optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1)
router_target = torch.tensor([0, 2, 1, 1, 0, 2])

LOSSES = []


def train_step(model, optimizer, tau):
    model.train()
    logits, aux, check, router_logits = model(dense, sparse, history, tags)
    router = F.gumbel_softmax(router_logits, tau=tau, hard=True)
    router_loss = -(router * F.log_softmax(router_logits, dim=-1)).sum(dim=-1).mean()
    loss = criterion(logits, clicks) + 0.01 * aux + 0.1 * router_loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    LOSSES.extend([loss.item(), aux.item(), router.argmax(dim=-1).float().sum().item()])
    assert check.item() < 1e-4


for step in range(3):
    train_step(model, optimizer, tau=1.0 - 0.2 * step)

model.eval()
with torch.no_grad():
    logits, _, _, _ = model(dense, sparse, history, tags)
    probs = torch.sigmoid(logits)
    LOSSES.append(F.binary_cross_entropy(probs, clicks).item())
    LOSSES.append(((probs > 0.5).float() == clicks).float().mean().item())
LOSSES.extend(model.moe.expert_counts.tolist())

# checkpoint round trip: a fresh model and optimizer resume from the saved state
buffer = io.BytesIO()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3}, buffer)
buffer.seek(0)
checkpoint = torch.load(buffer, weights_only=True)
torch.manual_seed(99)
resumed = DLRM()
missing, unexpected = resumed.load_state_dict(checkpoint["model"], strict=True)
assert not missing and not unexpected and "li" not in checkpoint["model"]
resumed_opt = torch.optim.Adagrad(resumed.parameters(), lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1)
resumed_opt.load_state_dict(checkpoint["optimizer"])
assert torch.equal(resumed.moe.expert_counts, model.moe.expert_counts)
for step in range(checkpoint["step"], 5):
    train_step(resumed, resumed_opt, tau=0.5)
MODELS = {"dlrm": resumed}
