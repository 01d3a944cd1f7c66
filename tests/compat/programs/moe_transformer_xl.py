# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A Transformer-XL style language model with a sparse mixture-of-experts feed-forward (Switch /
GShard-like) on a synthetic token stream: segment-level recurrence (each layer's hidden states cached
as detached memory and concatenated in front of the next segment's keys/values), learned relative
position biases through a bucketed index and nn.Embedding, a causal mask offset by the memory length
(torch.triu with diagonal), a top-2 token-choice router (softmax, torch.topk, renormalised gates),
tokens dispatched to experts with nonzero / index_select and combined back with index_add_, expert
load counted with scatter_add_ and torch.bincount, the Switch load-balancing auxiliary loss and a
router z-loss (logsumexp), capacity dropping by a cumsum position in expert, RMS-style pre-norm,
truncated backprop through time (memory detach), Adam with a warm-up LambdaLR and clip_grad_norm_."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MoEFeedForward(nn.Module):
    def __init__(self, dim, hidden, num_experts=4, top_k=2, capacity_factor=1.5):
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"),
                                                   nn.Linear(hidden, dim)) for _ in range(num_experts))

    def forward(self, x):
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        n = tokens.shape[0]
        logits = self.router(tokens)
        probs = F.softmax(logits, dim=-1, dtype=torch.float)
        gate_vals, expert_idx = torch.topk(probs, self.top_k, dim=-1)
        gate_vals = gate_vals / gate_vals.sum(dim=-1, keepdim=True)
        capacity = int(self.capacity_factor * n * self.top_k / self.num_experts)
        # position of each (token, choice) inside its expert's buffer, first choices first
        flat_expert = expert_idx.t().reshape(-1)                                # (k * n,)
        one_hot = F.one_hot(flat_expert, self.num_experts)
        position = (torch.cumsum(one_hot, dim=0) - 1)[torch.arange(flat_expert.numel()), flat_expert]
        keep = (position < capacity).reshape(self.top_k, n).t()                  # (n, k)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token_ids, choice = torch.nonzero((expert_idx == e) & keep, as_tuple=True)
            if token_ids.numel() == 0:
                continue
            y = expert(tokens.index_select(0, token_ids))
            out.index_add_(0, token_ids, y * gate_vals[token_ids, choice].unsqueeze(-1))
        counts = torch.zeros(self.num_experts).scatter_add_(0, expert_idx[:, 0], torch.ones(n))
        assert torch.equal(counts.long(), torch.bincount(expert_idx[:, 0], minlength=self.num_experts))
        aux = self.num_experts * (counts / n * probs.mean(dim=0)).sum()
        z_loss = torch.logsumexp(logits, dim=-1).pow(2).mean()
        dropped = (~keep).sum()
        return out.reshape(shape), aux, z_loss, dropped


class XLLayer(nn.Module):
    def __init__(self, dim, heads, num_buckets=8):
        super().__init__()
        self.heads, self.num_buckets = heads, num_buckets
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.rel_bias = nn.Embedding(num_buckets, heads)
        self.ff = MoEFeedForward(dim, 2 * dim)

    def forward(self, x, mem):
        b, t, d = x.shape
        h = self.norm1(x)
        ctx = torch.cat([mem, h], dim=1) if mem is not None else h
        m = ctx.shape[1] - t
        q = F.linear(h, self.qkv.weight[:d])
        k, v = F.linear(ctx, self.qkv.weight[d:]).chunk(2, dim=-1)
        q, k, v = (z.view(b, -1, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        rel = (torch.arange(t)[:, None] + m) - torch.arange(m + t)[None, :]          # query - key distance
        bucket = rel.clamp(0, self.num_buckets - 1)
        scores = scores + self.rel_bias(bucket).permute(2, 0, 1).unsqueeze(0)
        causal = torch.triu(torch.ones(t, m + t, dtype=torch.bool), diagonal=m + 1)
        scores = scores.masked_fill(causal, float("-inf"))
        attn = F.softmax(scores, dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(y)
        ff, aux, z, dropped = self.ff(self.norm2(x))
        return x + ff, h, aux, z, dropped


class TransformerXL(nn.Module):
    def __init__(self, vocab=20, dim=16, heads=2, layers=2, mem_len=6):
        super().__init__()
        self.mem_len = mem_len
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(XLLayer(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens, mems=None):
        x = self.embed(tokens)
        new_mems, aux_total, z_total, dropped_total = [], 0.0, 0.0, 0
        for i, layer in enumerate(self.layers):
            mem = None if mems is None else mems[i]
            x, h, aux, z, dropped = layer(x, mem)
            cat = h if mem is None else torch.cat([mem, h], dim=1)
            new_mems.append(cat[:, -self.mem_len:].detach())
            aux_total, z_total, dropped_total = aux_total + aux, z_total + z, dropped_total + dropped
        return self.head(self.norm(x)), new_mems, aux_total, z_total, dropped_total


torch.manual_seed(31)
model = TransformerXL()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.95))
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
stream = torch.randint(0, 20, (3, 4 * 5 + 1))
stream[:, 1::3] = (stream[:, 0:-1:3] + 1) % 20                 # a learnable pattern in the stream
seg = 5

LOSSES = []
mems = None
for step in range(4):
    inp = stream[:, step * seg:(step + 1) * seg]
    tgt = stream[:, step * seg + 1:(step + 1) * seg + 1]
    logits, mems, aux, z, dropped = model(inp, mems)
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
    loss = ce + 0.01 * aux + 1e-3 * z
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    LOSSES.extend([ce.item(), aux.item(), float(dropped), float(mems[0].shape[1]),
                   float(mems[1].requires_grad)])
MODELS = {"xl": model}
