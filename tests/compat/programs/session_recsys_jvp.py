# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A session-based recommender as a recsys team writes it: item and user tables are nn.Embedding /
nn.EmbeddingBag(mode="sum", per_sample_weights) trained by Adagrad while the dense tower uses
Adam (two optimizers, one backward); the tables' gradients are inspected for a per-row update
count (nonzero rows, index_add_); sliding windows over each session by as_strided; periodic features from a complex64 rfft (abs,
angle); a smoothness penalty from a forward-mode directional derivative of the dense tower
(torch.func.jvp over torch.func.functional_call, differentiated again by the loss's backward); one
step under torch.autograd.detect_anomaly; the backend switches a training script sets
(torch.backends.cudnn, mkldnn)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, jvp

torch.backends.cudnn.benchmark = False
torch.backends.cudnn.deterministic = True
assert isinstance(torch.backends.mkldnn.is_available(), bool)

N_ITEMS, N_USERS, DIM, SESSION, WINDOW = 40, 12, 8, 10, 4


class Tower(nn.Module):
    def __init__(self, d_in, d):
        super().__init__()
        self.fc1 = nn.Linear(d_in, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.items = nn.Embedding(N_ITEMS, DIM)
        self.users = nn.EmbeddingBag(N_USERS, DIM, mode="sum")
        self.tower = Tower(3 * DIM + 2 * (WINDOW // 2 + 1), DIM)

    def session_features(self, session, weights):
        e = self.items(session)                                       # (B, S, D)
        b, s, d = e.shape
        # windows of WINDOW consecutive items, stepping one item: (B, S - W + 1, W, D)
        win = e.as_strided((b, s - WINDOW + 1, WINDOW, d), (s * d, d, d, 1))
        pooled = (win * weights.view(1, 1, WINDOW, 1)).sum(2).mean(1)  # (B, D)
        return e.mean(1), pooled

    def forward(self, session, users, user_offsets, user_w, weights):
        last, pooled = self.session_features(session, weights)
        u = self.users(users, user_offsets, per_sample_weights=user_w)
        spec = torch.fft.rfft(session[:, -WINDOW:].float() / N_ITEMS, dim=1)   # complex64
        assert spec.dtype == torch.complex64
        feats = torch.cat([last, pooled, u, spec.abs(), spec.angle()], dim=1)
        return self.tower(feats), feats


torch.manual_seed(0)
model = Recommender()
table_opt = torch.optim.Adagrad(list(model.items.parameters()) + list(model.users.parameters()), lr=0.05)
dense_opt = torch.optim.Adam(model.tower.parameters(), lr=3e-3)
window_w = torch.softmax(torch.arange(WINDOW, dtype=torch.float32), 0)

g = torch.Generator().manual_seed(5)
LOSSES, ROWS_TOUCHED = [], torch.zeros(N_ITEMS)
for step in range(6):
    session = torch.randint(0, N_ITEMS, (6, SESSION), generator=g)
    target = torch.randint(0, N_ITEMS, (6,), generator=g)
    users = torch.randint(0, N_USERS, (9,), generator=g)
    offsets = torch.tensor([0, 1, 3, 4, 6, 8])
    user_w = torch.rand(9, generator=g)

    anomaly = torch.autograd.detect_anomaly() if step == 2 else torch.enable_grad()
    with anomaly:
        out, feats = model(session, users, offsets, user_w, window_w)
        scores = out @ model.items.weight.t()
        loss = F.cross_entropy(scores, target)

        # directional derivative of the tower along a fixed direction, as a smoothness penalty
        params = dict(model.tower.named_parameters())
        direction = torch.ones_like(feats) / feats.shape[1] ** 0.5
        _, tangent = jvp(lambda f: functional_call(model.tower, params, (f,)), (feats.detach(),), (direction,))
        loss = loss + 0.01 * tangent.pow(2).mean()

        table_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()

    grad = model.items.weight.grad
    assert not grad.is_sparse
    rows = grad.abs().sum(1).nonzero().squeeze(1)
    ROWS_TOUCHED.index_add_(0, rows, torch.ones(rows.shape[0]))
    dense_norm = grad.norm()
    table_opt.step()
    dense_opt.step()
    LOSSES.append(loss.item() + 0.0 * float(dense_norm))

LOSSES.append(float(ROWS_TOUCHED.sum()) / 100)
MODELS = {"recsys": model}
