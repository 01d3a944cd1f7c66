# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A byte-level decoder LM in the Hugging Face style: padded batches with an attention_mask
(padding_idx embeddings, a bool causal mask from torch.triu combined with the padding mask for
F.scaled_dot_product_attention, labels shifted with ignore_index=-100), rotary embeddings through
torch.polar / view_as_complex, tied input/output embeddings, then generation with a key/value
cache under torch.inference_mode (past keys and values concatenated step by step, nucleus
sampling by sort / cumsum / scatter and torch.multinomial with a generator), checked against the
uncached forward; the state dict round-trips through an in-memory torch.save / torch.load."""
import io

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, PAD = 32, 16, 2, 0


def rotary(x, pos):
    """x: (B, H, T, hd) rotated by angles pos * freqs (complex multiplication)."""
    hd = x.shape[-1]
    freqs = 1.0 / (100.0 ** (torch.arange(0, hd, 2).float() / hd))
    rot = torch.polar(torch.ones(len(pos), hd // 2), torch.outer(pos.float(), freqs))
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], hd // 2, 2))
    return torch.view_as_real(xc * rot).flatten(-2).type_as(x)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.o = nn.Linear(DIM, 3 * DIM, bias=False), nn.Linear(DIM, DIM, bias=False)
        self.mlp = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(approximate="tanh"), nn.Linear(2 * DIM, DIM))

    def forward(self, x, mask, pos, past=None):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        q, k = rotary(q, pos), rotary(k, pos)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(out.transpose(1, 2).reshape(b, t, DIM))
        return x + self.mlp(self.norm2(x)), (k, v)


class ByteLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight                  # tied

    def forward(self, ids, attention_mask=None, past=None, start=0):
        b, t = ids.shape
        total = start + t
        causal = ~torch.triu(torch.ones(t, total, dtype=torch.bool), diagonal=start + 1)
        mask = causal[None, None]
        if attention_mask is not None:
            mask = mask & attention_mask[:, None, None, :total].bool()
        pos = torch.arange(start, total)
        x, presents = self.embed(ids), []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, mask, pos, None if past is None else past[i])
            presents.append(kv)
        return self.lm_head(self.norm(x)), presents


def batch(texts):
    ids = [torch.tensor(list(t.encode()), dtype=torch.long) % (VOCAB - 1) + 1 for t in texts]
    n = max(len(i) for i in ids)
    input_ids = torch.full((len(ids), n), PAD)
    attention = torch.zeros(len(ids), n, dtype=torch.long)
    for r, i in enumerate(ids):                                # right padding
        input_ids[r, :len(i)], attention[r, :len(i)] = i, 1
    labels = input_ids.masked_fill(attention == 0, -100)
    return input_ids, attention, labels


@torch.inference_mode()
def generate(model, prompt, steps, top_p=0.9, generator=None):
    logits, past = model(prompt)
    out = prompt
    for _ in range(steps):
        probs = logits[:, -1].softmax(-1)
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p
        filtered = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)
        nxt = torch.multinomial(filtered / filtered.sum(-1, keepdim=True), 1, generator=generator)
        out = torch.cat([out, nxt], dim=1)
        logits, past = model(nxt, past=past, start=out.shape[1] - 1)
    return out, logits


torch.manual_seed(0)
model = ByteLM()
opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
texts = ["hello world", "holoflow", "pytorch compatible", "kv cache"]
LOSSES = []
for step in range(4):
    ids, attention, labels = batch(texts[step % 2::2] + texts[:1])
    logits, _ = model(ids, attention_mask=attention)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)
    opt.zero_grad()
    loss.backward()
    opt.step()
    LOSSES.append(loss.item())

model.eval()
prompt = batch(["hel"])[0]
tokens, last_logits = generate(model, prompt, 5, generator=torch.Generator().manual_seed(3))
with torch.no_grad():
    full, _ = model(tokens)
assert torch.allclose(full[:, -1], last_logits[:, -1], atol=1e-5)   # the cache computes what the whole pass does
LOSSES.append(float(tokens.sum()))

buffer = io.BytesIO()
torch.save(model.state_dict(), buffer)
buffer.seek(0)
clone = ByteLM()
clone.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
with torch.no_grad():
    LOSSES.append(float((clone(prompt)[0] - model(prompt)[0]).abs().max()))
assert clone.lm_head.weight is clone.embed.weight

model.train()
ids, attention, labels = batch(texts)
logits, _ = model(ids, attention_mask=attention)
F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1)).backward()
MODELS = {"lm": model}
