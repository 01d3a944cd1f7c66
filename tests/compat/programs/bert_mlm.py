# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A BERT-style masked language model: token + learned position embeddings, TransformerEncoder
(batch_first, GELU, pre-norm) with a key padding mask, tied output weights, masked tokens chosen
with bernoulli, label smoothing with ignore_index=-100, AdamW with no decay on biases and norms,
a linear warm-up by LambdaLR, clip_grad_norm_, trunc_normal_ init."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

V, D, T, PAD, MASK = 50, 32, 12, 0, 1


class MLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D, padding_idx=PAD)
        self.pos = nn.Parameter(torch.zeros(1, T, D))
        nn.init.trunc_normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.bias = nn.Parameter(torch.zeros(V))

    def forward(self, ids):
        pad = ids.eq(PAD)
        h = self.enc(self.tok(ids) * math.sqrt(D) + self.pos, src_key_padding_mask=pad)
        return F.linear(self.norm(h), self.tok.weight, self.bias)


torch.manual_seed(0)
model = MLM()
decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n]
no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "norm" not in n)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=3e-3, betas=(0.9, 0.98))
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
ids = torch.randint(2, V, (6, T))
ids[0, 9:] = PAD
ids[3, 7:] = PAD
LOSSES = []
for step in range(4):
    chosen = torch.bernoulli(torch.full(ids.shape, 0.3)).bool() & ids.ne(PAD)
    inputs = ids.masked_fill(chosen, MASK)
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    logits = model(inputs)
    loss = F.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100, label_smoothing=0.1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
    LOSSES.append(norm.item())
MODELS = {"mlm": model}
