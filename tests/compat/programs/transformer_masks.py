# ruff: noqa: B007  (published-style loops keep their unused counters)
"""nn.Transformer end to end with every mask: a causal tgt_mask from
generate_square_subsequent_mask, src/tgt key padding masks, a memory mask; a separate
nn.MultiheadAttention pooling layer (key_padding_mask, need_weights=False) over the encoder
output; tied input/output embeddings; greedy decoding under inference_mode; Adam with a
LinearLR -> ConstantLR SequentialLR."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Seq2Seq(nn.Module):
    def __init__(self, vocab=13, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, 12, d) * 0.1)
        self.tf = nn.Transformer(d, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                                 dropout=0.0, batch_first=True, norm_first=True)
        self.pool = nn.MultiheadAttention(d, 2, batch_first=True)
        self.query = nn.Parameter(torch.randn(1, 1, d))
        self.cls = nn.Linear(d, 2)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, src, tgt):
        s = self.emb(src) + self.pos[:, :src.shape[1]]
        t = self.emb(tgt) + self.pos[:, :tgt.shape[1]]
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        src_pad, tgt_pad = src == 0, tgt == 0
        memory = self.tf.encoder(s, src_key_padding_mask=src_pad)
        h = self.tf.decoder(t, memory, tgt_mask=causal, tgt_key_padding_mask=tgt_pad,
                            memory_key_padding_mask=src_pad)
        pooled, _ = self.pool(self.query.expand(src.shape[0], -1, -1), memory, memory,
                              key_padding_mask=src_pad, need_weights=False)
        return self.out(h), self.cls(pooled.squeeze(1))


torch.manual_seed(0)
model = Seq2Seq()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [torch.optim.lr_scheduler.LinearLR(opt, 0.3, 1.0, 2),
                                                    torch.optim.lr_scheduler.ConstantLR(opt, 0.5, 2)], milestones=[2])
src = torch.tensor([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]])
tgt = torch.tensor([[1, 6, 5, 4, 3, 0], [1, 12, 11, 10, 9, 8]])
gold = torch.tensor([[6, 5, 4, 3, 2, 0], [12, 11, 10, 9, 8, 2]])
label = torch.tensor([0, 1])
LOSSES = []
for step in range(5):
    opt.zero_grad()
    logits, cls = model(src, tgt)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), gold.reshape(-1), ignore_index=0) \
        + F.cross_entropy(cls, label)
    loss.backward()
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
model.eval()
with torch.inference_mode():
    ys = torch.ones(2, 1, dtype=torch.long)
    for i in range(4):
        logits, _ = model(src, ys)
        ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
LOSSES.append(float(ys.sum()))
MODELS = {"seq2seq": model}
