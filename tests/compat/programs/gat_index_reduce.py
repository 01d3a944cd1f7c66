# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A graph attention network (Velickovic et al.) with PNA-style multi-aggregators, written with
PyTorch's reduction-by-index ops as PyG's pure-torch fallbacks are: multi-head edge scores with
LeakyReLU, flagged edges' scores set to a learned 0-d parameter by Tensor.index_fill, a segment
softmax by Tensor.scatter_reduce(amax, include_self=False) + index_add_ (an autograd.Function with
its own backward, kept in float32 by torch.amp.custom_fwd/custom_bwd inside an autocast region),
messages aggregated by scatter_reduce in the modes sum / mean / amax / amin (include_self False
and True, nodes without in-edges included), Tensor.index_reduce_ (mean and amax, ReLU'd messages
so the max has ties), Tensor.index_add with alpha, scatter_add for degrees, per-graph readout by
index_reduce('amax'), nn.ParameterList of per-layer attention vectors, node classification with
label smoothing and masks, NAdam + CosineAnnealingLR."""
import torch
import torch.nn as nn
import torch.nn.functional as F

N, E_IN, HID, HEADS, CLASSES = 14, 6, 8, 2, 3


def segment_softmax(score, dst, n):
    top = score.new_zeros(n, score.shape[1]).scatter_reduce(0, dst.unsqueeze(1).expand_as(score), score,
                                                           reduce="amax", include_self=False)
    w = (score - top[dst]).exp()
    denom = score.new_zeros(n, score.shape[1]).index_add_(0, dst, w)
    return w / denom[dst]


class SegmentSoftmax(torch.autograd.Function):
    """The attention normalization with its own backward, kept in float32 under autocast."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, score, dst, n):
        alpha = segment_softmax(score, dst, n)
        ctx.save_for_backward(alpha, dst)
        ctx.n = n
        return alpha

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        alpha, dst = ctx.saved_tensors
        ga = g * alpha
        total = ga.new_zeros(ctx.n, ga.shape[1]).index_add_(0, dst, ga)
        return ga - alpha * total[dst], None, None


class GATLayer(nn.Module):
    def __init__(self, d_in, d_out, heads):
        super().__init__()
        self.heads, self.d_out = heads, d_out
        self.lin = nn.Linear(d_in, heads * d_out, bias=False)
        self.att = nn.ParameterList([nn.Parameter(torch.randn(heads, d_out) * 0.3) for _ in range(2)])
        self.mix = nn.Linear(5 * heads * d_out, d_out)
        self.null_score = nn.Parameter(torch.tensor(-1.0))          # a learned score for flagged edges

    def forward(self, x, src, dst, flagged):
        n = x.shape[0]
        h = self.lin(x).view(n, self.heads, self.d_out)
        score = F.leaky_relu((h[src] * self.att[0]).sum(-1) + (h[dst] * self.att[1]).sum(-1), 0.2)
        score = score.index_fill(0, flagged, self.null_score)
        with torch.autocast("cpu", dtype=torch.bfloat16):               # (AMP around the kernel)
            alpha = SegmentSoftmax.apply(score, dst, n)                 # (E, heads), float32
        msg = (h[src] * alpha.unsqueeze(-1)).reshape(len(src), -1)      # (E, heads * d_out)
        idx = dst.unsqueeze(1).expand_as(msg)
        zeros = msg.new_zeros(n, msg.shape[1])
        agg_sum = zeros.scatter_reduce(0, idx, msg, reduce="sum")
        agg_mean = zeros.scatter_reduce(0, idx, msg, reduce="mean", include_self=False)
        agg_max = zeros.scatter_reduce(0, idx, msg, reduce="amax", include_self=False)
        agg_min = h.reshape(n, -1).scatter_reduce(0, idx, msg, reduce="amin", include_self=True)
        relu_msg = F.relu(msg)
        agg_rmax = zeros.clone().index_reduce_(0, dst, relu_msg, "amax", include_self=True)
        agg_rmean = zeros.clone().index_reduce_(0, dst, relu_msg, "mean", include_self=False)
        out = torch.cat([agg_sum, agg_mean, agg_max - agg_min, agg_rmax, agg_rmean], dim=1)
        return F.elu(self.mix(out)) + x.index_add(1, torch.arange(self.d_out) % x.shape[1],
                                                   x.new_ones(n, self.d_out), alpha=0.5)[:, :1]


class GAT(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([GATLayer(E_IN, HID, HEADS), GATLayer(HID, HID, HEADS)])
        self.cls = nn.Linear(HID, CLASSES)
        self.graph_head = nn.Linear(HID, 1)

    def forward(self, x, src, dst, flagged, graph_of, n_graphs):
        for layer in self.layers:
            x = layer(x, src, dst, flagged)
        pooled = x.new_full((n_graphs, x.shape[1]), -1e4).index_reduce(0, graph_of, x, "amax", include_self=False)
        deg = torch.zeros(x.shape[0]).scatter_add(0, dst, torch.ones(len(dst)))
        return self.cls(x), self.graph_head(pooled).squeeze(1), deg


torch.manual_seed(0)
# two graphs; node 6 and 13 receive no edges, node 2 receives many (duplicate edges too)
src = torch.tensor([0, 1, 3, 4, 5, 0, 1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 8, 7, 9, 3])
dst = torch.tensor([2, 2, 2, 2, 2, 1, 0, 3, 5, 4, 8, 9, 10, 11, 12, 7, 7, 8, 8, 2])
graph_of = torch.tensor([0] * 7 + [1] * 7)
flagged = torch.tensor([19, 3, 19])        # the duplicate edge (and one more) get the learned score
x = torch.randn(N, E_IN)
labels = torch.randint(0, CLASSES, (N,))
train_mask = torch.rand(N) < 0.7
graph_y = torch.tensor([1.0, -0.5])
model = GAT()
opt = torch.optim.NAdam(model.parameters(), lr=0.01, momentum_decay=4e-3, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6, eta_min=1e-3)
LOSSES = []
for step in range(6):
    opt.zero_grad()
    logits, graph_pred, deg = model(x, src, dst, flagged, graph_of, 2)
    loss = F.cross_entropy(logits[train_mask], labels[train_mask], label_smoothing=0.1)
    loss = loss + F.mse_loss(graph_pred, graph_y)
    loss.backward()
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
with torch.no_grad():
    acc = (logits.argmax(1) == labels)[~train_mask].float().mean()
LOSSES += [acc.item(), deg.sum().item(), deg.max().item(), sched.get_last_lr()[0]]
MODELS = {"gat": model}
