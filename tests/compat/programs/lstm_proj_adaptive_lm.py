# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A multi-task language model over variable-length sentences: a 2-layer bidirectional nn.LSTM
with proj_size (LSTMP, Sak et al.) over pack_padded_sequence(enforce_sorted=False) and back by
pad_packed_sequence(total_length=...), a cross-attention nn.MultiheadAttention with kdim/vdim
different from embed_dim, batch_first, a float key_padding_mask plus a float attn_mask, per-head weights
(need_weights, average_attn_weights=False), a norm_first nn.TransformerDecoder with tgt and memory
masks (memory_key_padding_mask too), nn.AdaptiveLogSoftmaxWithLoss over a Zipf vocabulary
(three cutoffs and a div_value that leaves the last cluster a zero-width projection, head_bias;
log_prob and predict), and auxiliary heads on PoissonNLLLoss (a
length count), GaussianNLLLoss (a predicted variance) and MultiLabelSoftMarginLoss (bag-of-tags);
RAdam with decoupled weight decay, gradient clipping by value, OneCycleLR."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

VOCAB, EMB, HID, PROJ, KV, MEM, TAGS, B, T = 60, 16, 12, 6, 10, 5, 7, 6, 9


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, EMB, padding_idx=0)
        self.lstm = nn.LSTM(EMB, HID, num_layers=2, bidirectional=True, batch_first=True, proj_size=PROJ,
                            dropout=0.0)
        self.q = nn.Linear(2 * PROJ, EMB)
        self.cross = nn.MultiheadAttention(EMB, 4, batch_first=True, kdim=KV, vdim=MEM, bias=True)
        layer = nn.TransformerDecoderLayer(EMB, 2, dim_feedforward=24, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.decoder = nn.TransformerDecoder(layer, num_layers=2, norm=nn.LayerNorm(EMB))
        self.mem_proj = nn.Linear(MEM, EMB)
        # div_value 4 with a 16-wide input: the last tail cluster projects to 16 // 4 ** 3 == 0 features
        self.asm = nn.AdaptiveLogSoftmaxWithLoss(EMB, VOCAB, cutoffs=[6, 14, 30], div_value=4.0, head_bias=True)
        self.count = nn.Linear(EMB, 1)
        self.var = nn.Linear(EMB, 2)
        self.tags = nn.Linear(EMB, TAGS)

    def forward(self, tokens, lengths, keys, values, mem_pad, mem_pad_bias, attn_bias):
        x = self.emb(tokens)
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = self.lstm(packed)
        out, out_len = pad_packed_sequence(out, batch_first=True, total_length=T)
        q = self.q(out)
        ctx, attn = self.cross(q, keys, values, key_padding_mask=mem_pad_bias, attn_mask=attn_bias,
                               need_weights=True, average_attn_weights=False)
        tgt_pad = torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T)
        memory = self.mem_proj(values)
        mem_mask = torch.zeros(T, values.shape[1], dtype=torch.bool)
        mem_mask[:2, -1] = True                                       # the first steps may not see the last slot
        y = self.decoder(q + ctx, memory, tgt_mask=causal, memory_mask=mem_mask,
                         tgt_key_padding_mask=torch.zeros(tgt_pad.shape).masked_fill(tgt_pad, float("-inf")),
                         memory_key_padding_mask=mem_pad, tgt_is_causal=True)
        pooled = (y * (~tgt_pad).unsqueeze(-1)).sum(1) / lengths.unsqueeze(1)
        return y, tgt_pad, attn, h, c, out_len, pooled


torch.manual_seed(0)
model = Model()
zipf = 1.0 / torch.arange(1, VOCAB).float()
lengths = torch.tensor([9, 4, 7, 2, 9, 5])
tokens = torch.multinomial(zipf, B * T, replacement=True).view(B, T) + 1
tokens = tokens.masked_fill(torch.arange(T).unsqueeze(0) >= lengths.unsqueeze(1), 0)
keys, values = torch.randn(B, 4, KV), torch.randn(B, 4, MEM)
mem_pad = torch.tensor([[False, False, False, True]] * 3 + [[False, False, True, True]] * 3)
mem_pad_bias = torch.zeros(B, 4).masked_fill(mem_pad, float("-inf"))     # float, as the attn_mask
attn_bias = torch.randn(T, 4) * 0.1
tag_target = (torch.rand(B, TAGS) < 0.3).float()
var_target = torch.randn(B, 2)

opt = torch.optim.RAdam(model.parameters(), lr=3e-3, weight_decay=0.01, decoupled_weight_decay=True)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=6, pct_start=0.4)
poisson = nn.PoissonNLLLoss(log_input=True, full=True)
gauss = nn.GaussianNLLLoss(full=True, eps=1e-4)
mlsm = nn.MultiLabelSoftMarginLoss(weight=torch.linspace(0.5, 1.5, TAGS))
LOSSES = []
for step in range(6):
    opt.zero_grad()
    y, tgt_pad, attn, h, c, out_len, pooled = model(tokens, lengths, keys, values, mem_pad, mem_pad_bias, attn_bias)
    # next-token prediction on the real (unpadded) positions
    valid = ~tgt_pad[:, 1:]
    hidden, target = y[:, :-1][valid], tokens[:, 1:][valid]
    asm_out = model.asm(hidden, target)
    loss = asm_out.loss
    loss = loss + 0.1 * poisson(model.count(pooled).squeeze(1), lengths.float())
    mu_var = model.var(pooled)
    loss = loss + 0.1 * gauss(mu_var[:, 0:1].expand(-1, 2), var_target, F.softplus(mu_var[:, 1:2]).expand(-1, 2))
    loss = loss + 0.1 * mlsm(model.tags(pooled), tag_target)
    loss.backward()
    nn.utils.clip_grad_value_(model.parameters(), clip_value=0.5)
    opt.step()
    sched.step()
    LOSSES += [loss.item(), asm_out.output.sum().item()]
with torch.no_grad():
    logp = model.asm.log_prob(hidden)
    pred = model.asm.predict(hidden)
LOSSES += [logp.logsumexp(1).abs().max().item() * 1e3, float(pred.sum()), attn.shape[1], attn.sum().item(),
           attn[:, :, :, -1].abs().sum().item(), h.shape[0], h.shape[-1], c.shape[-1], float(out_len.sum()),
           sched.get_last_lr()[0]]
MODELS = {"model": model}
