# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A CLIP-style contrastive image-text model with a captioning decoder (CoCa-like): a small CNN image
tower producing a pooled embedding and a grid of patch tokens, a text tower over variable-length
captions through nn.LSTM on pack_padded_sequence(enforce_sorted=False) with the final hidden states
(h_n of both directions) in the original batch order, L2-normalised embeddings (F.normalize), a learnable
logit_scale initialised to log(1/0.07), exponentiated and clamped in place (logit_scale.data.clamp_)
after each step, the symmetric InfoNCE loss over torch.arange labels, plus an nn.TransformerDecoder
(batch_first, norm_first) captioner over the image patch tokens with a causal tgt_mask, a bool
tgt_key_padding_mask and a memory_key_padding_mask, teacher forcing with ignore_index on pads,
Adam with separate parameter groups (no weight decay on logit_scale), gradient accumulation over
two micro-batches, and retrieval accuracy under torch.no_grad."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence

PAD, BOS, VOCAB = 0, 1, 14


class ImageTower(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(3, 12, 3, stride=2, padding=1), nn.GELU(),
                                  nn.Conv2d(12, dim, 3, stride=2, padding=1))
        self.ln = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        grid = self.conv(x).flatten(2).transpose(1, 2)               # (B, HW, D)
        grid = self.ln(grid)
        return self.proj(grid.mean(dim=1)), grid


class TextTower(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.lstm = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        return self.proj(torch.cat([h_n[-2], h_n[-1]], dim=-1))


class CoCa(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.image = ImageTower(dim)
        self.text = TextTower(dim)
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))
        layer = nn.TransformerDecoderLayer(dim, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.decoder = nn.TransformerDecoder(layer, num_layers=2, norm=nn.LayerNorm(dim))
        self.tok = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(1, 12, dim) * 0.02)
        self.lm_head = nn.Linear(dim, VOCAB)

    def forward(self, images, captions, lengths, patch_mask):
        img_emb, grid = self.image(images)
        txt_emb = self.text(captions, lengths)
        img_emb, txt_emb = F.normalize(img_emb, dim=-1), F.normalize(txt_emb, dim=-1)
        logits_per_image = self.logit_scale.exp() * img_emb @ txt_emb.t()
        dec_in = torch.cat([torch.full((captions.size(0), 1), BOS), captions[:, :-1]], dim=1)
        t = dec_in.size(1)
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(t)
        tgt_pad = dec_in == PAD
        tgt_pad[:, 0] = False
        h = self.decoder(self.tok(dec_in) + self.pos[:, :t], grid, tgt_mask=tgt_mask, tgt_key_padding_mask=tgt_pad,
                         memory_key_padding_mask=patch_mask, tgt_is_causal=True)
        return logits_per_image, self.lm_head(h)


def contrastive_loss(logits_per_image):
    labels = torch.arange(logits_per_image.size(0))
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_image.t(), labels)) / 2


torch.manual_seed(23)
model = CoCa()
images = torch.randn(6, 3, 8, 8)
caps = [torch.randint(2, VOCAB, (int(n),)) for n in [5, 3, 6, 2, 4, 5]]
lengths = torch.tensor([len(c) for c in caps])
captions = pad_sequence(caps, batch_first=True, padding_value=PAD)            # (6, 6), unsorted lengths
patch_mask = torch.zeros(6, 4, dtype=torch.bool)
patch_mask[::2, -1] = True                                                    # some patches unseen
decay = [p for n, p in model.named_parameters() if n != "logit_scale" and p.ndim >= 2]
no_decay = [p for n, p in model.named_parameters() if n != "logit_scale" and p.ndim < 2]
optimizer = torch.optim.Adam([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay},
                              {"params": [model.logit_scale], "lr": 0.1}], lr=2e-3)

LOSSES = []
for step in range(4):
    optimizer.zero_grad()
    for micro in (slice(0, 3), slice(3, 6)):
        logits_per_image, lm_logits = model(images[micro], captions[micro], lengths[micro], patch_mask[micro])
        clip = contrastive_loss(logits_per_image)
        caption = F.cross_entropy(lm_logits.reshape(-1, VOCAB), captions[micro].reshape(-1), ignore_index=PAD)
        loss = (clip + caption) / 2
        loss.backward()
        LOSSES.extend([clip.item(), caption.item()])
    optimizer.step()
    with torch.no_grad():
        model.logit_scale.data.clamp_(0, math.log(100))
    LOSSES.append(model.logit_scale.item())

model.eval()
with torch.no_grad():
    logits_per_image, lm_logits = model(images, captions, lengths, patch_mask)
    LOSSES.append((logits_per_image.argmax(dim=1) == torch.arange(6)).float().mean().item())
    LOSSES.append(logits_per_image.softmax(dim=-1).diagonal().mean().item())
    LOSSES.append(lm_logits.argmax(-1)[captions != PAD].float().mean().item())
MODELS = {"coca": model}
