# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A toy sequence-to-sequence translation model in the style of PyTorch's "Language Translation with
nn.Transformer" tutorial, on a reverse-the-sequence task: token embeddings scaled by sqrt(d_model) plus a
sinusoidal positional encoding, nn.Transformer(batch_first=True, activation="gelu") encoder-decoder with
Transformer.generate_square_subsequent_mask, src/tgt key padding masks (bool) and memory_key_padding_mask,
CrossEntropyLoss(label_smoothing=0.1, ignore_index=PAD), Adam(betas=(0.9, 0.98), eps=1e-9) with the Noam
warm-up schedule through LambdaLR, clip_grad_norm_, and greedy decoding under torch.no_grad at the end
(model.encode / model.decode, argmax, torch.cat of the growing prefix); the eval-mode encoder with a
padding mask is torch's nested-tensor fast path (zeros at the padded positions before the final norm)."""
import math

import torch
import torch.nn as nn

PAD, BOS, EOS, VOCAB = 0, 1, 2, 12


class PositionalEncoding(nn.Module):
    def __init__(self, emb_size, dropout, maxlen=32):
        super().__init__()
        den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding.unsqueeze(0))

    def forward(self, token_embedding):
        return self.dropout(token_embedding + self.pos_embedding[:, :token_embedding.size(1)])


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size, emb_size):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.emb_size = emb_size

    def forward(self, tokens):
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, num_encoder_layers, num_decoder_layers, emb_size, nhead, vocab, dim_feedforward, dropout=0.1):
        super().__init__()
        self.transformer = nn.Transformer(d_model=emb_size, nhead=nhead, num_encoder_layers=num_encoder_layers,
                                          num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward,
                                          dropout=dropout, batch_first=True, activation="gelu")
        self.generator = nn.Linear(emb_size, vocab)
        self.src_tok_emb = TokenEmbedding(vocab, emb_size)
        self.tgt_tok_emb = TokenEmbedding(vocab, emb_size)
        self.positional_encoding = PositionalEncoding(emb_size, dropout=dropout)

    def forward(self, src, trg, tgt_mask, src_padding_mask, tgt_padding_mask):
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(trg))
        outs = self.transformer(src_emb, tgt_emb, None, tgt_mask, None, src_padding_mask, tgt_padding_mask,
                                src_padding_mask)
        return self.generator(outs)

    def encode(self, src, src_padding_mask=None):
        return self.transformer.encoder(self.positional_encoding(self.src_tok_emb(src)),
                                        src_key_padding_mask=src_padding_mask)

    def decode(self, tgt, memory, tgt_mask):
        return self.transformer.decoder(self.positional_encoding(self.tgt_tok_emb(tgt)), memory, tgt_mask)


def make_batch(n, max_len):
    lengths = torch.randint(3, max_len + 1, (n,))
    src = torch.full((n, max_len + 1), PAD, dtype=torch.long)
    tgt = torch.full((n, max_len + 2), PAD, dtype=torch.long)
    for i, length in enumerate(lengths.tolist()):
        seq = torch.randint(3, VOCAB, (length,))
        src[i, :length] = seq
        src[i, length] = EOS
        tgt[i, 0] = BOS
        tgt[i, 1:length + 1] = seq.flip(0)
        tgt[i, length + 1] = EOS
    return src, tgt


def create_mask(src, tgt):
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
    return tgt_mask, (src == PAD), (tgt == PAD)


def greedy_decode(model, src, max_len):
    memory = model.encode(src)
    ys = torch.ones(1, 1).fill_(BOS).type(torch.long)
    for i in range(max_len - 1):
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(ys.size(1)).type(torch.bool)
        out = model.decode(ys, memory, tgt_mask)
        prob = model.generator(out[:, -1])
        _, next_word = torch.max(prob, dim=1)
        ys = torch.cat([ys, torch.ones(1, 1).type_as(src.data).fill_(next_word.item())], dim=1)
        if next_word.item() == EOS:
            break
    return ys


torch.manual_seed(7)
d_model, warmup = 16, 4
model = Seq2SeqTransformer(2, 2, d_model, 4, VOCAB, 32, dropout=0.1)
for p in model.parameters():
    if p.dim() > 1:
        nn.init.xavier_uniform_(p)
loss_fn = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda step: d_model ** -0.5 * min((step + 1) ** -0.5, (step + 1) * warmup ** -1.5))
src, tgt = make_batch(6, 6)
LOSSES = []
model.train()
for step in range(5):
    tgt_input, tgt_out = tgt[:, :-1], tgt[:, 1:]
    tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt_input)
    logits = model(src, tgt_input, tgt_mask, src_padding_mask, tgt_padding_mask)
    optimizer.zero_grad()
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    LOSSES += [loss.item(), norm.item(), scheduler.get_last_lr()[0]]
model.eval()
with torch.no_grad():
    decoded = greedy_decode(model, src[:1, :int((src[0] != PAD).sum())], max_len=8)
    LOSSES += [float(decoded.size(1)), float(decoded.sum())]
    memory = model.encode(src, src == PAD)
    LOSSES += [memory.abs().sum().item(), memory[src == PAD].abs().sum().item()]
    tgt_input = tgt[:, :-1]
    tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt_input)
    LOSSES.append(loss_fn(model(src, tgt_input, tgt_mask, src_padding_mask, tgt_padding_mask).flatten(0, 1),
                          tgt[:, 1:].flatten()).item())
MODELS = {"seq2seq": model}
