# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A seq2seq GRU translator (PyTorch tutorial style): bidirectional encoder over a padded batch
through pack_padded_sequence/pad_packed_sequence, a GRU decoder with teacher forcing and
attention over the encoder outputs, NLLLoss ignoring padding, Adam."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

PAD, SOS = 0, 1


class EncoderRNN(nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden, padding_idx=PAD)
        self.gru = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, hidden)

    def forward(self, src, lengths):
        packed = pack_padded_sequence(self.embedding(src), lengths, batch_first=True, enforce_sorted=False)
        outputs, hidden = self.gru(packed)
        outputs, _ = pad_packed_sequence(outputs, batch_first=True)
        hidden = torch.tanh(self.fc(torch.cat((hidden[-2], hidden[-1]), dim=1)))
        return self.fc(outputs), hidden.unsqueeze(0)


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden, vocab):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, token, hidden, enc_out, mask):
        emb = self.embedding(token)
        scores = torch.bmm(hidden.transpose(0, 1), enc_out.transpose(1, 2)).masked_fill(~mask.unsqueeze(1), -1e9)
        context = torch.bmm(F.softmax(scores, dim=-1), enc_out)
        output, hidden = self.gru(torch.cat((emb, context), dim=2), hidden)
        return F.log_softmax(self.out(output.squeeze(1)), dim=-1), hidden


torch.manual_seed(3)
vocab, hidden = 20, 16
encoder, decoder = EncoderRNN(vocab, hidden), AttnDecoderRNN(hidden, vocab)
params = list(encoder.parameters()) + list(decoder.parameters())
optimizer = torch.optim.Adam(params, lr=0.01)
criterion = nn.NLLLoss(ignore_index=PAD)
lengths = torch.tensor([5, 3, 4])
src = torch.randint(2, vocab, (3, 5))
for b, n in enumerate(lengths.tolist()):
    src[b, n:] = PAD
tgt = torch.randint(2, vocab, (3, 4))
tgt[1, 3] = PAD
LOSSES = []
for step in range(3):
    optimizer.zero_grad()
    enc_out, hidden = encoder(src, lengths)
    mask = torch.arange(enc_out.size(1)).unsqueeze(0) < lengths.unsqueeze(1)
    token = torch.full((3, 1), SOS, dtype=torch.long)
    loss = 0
    for t in range(tgt.size(1)):
        logp, hidden = decoder(token, hidden, enc_out, mask)
        loss = loss + criterion(logp, tgt[:, t])
        token = tgt[:, t].unsqueeze(1)          # teacher forcing
    loss.backward()
    nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    LOSSES.append(loss.item() / tgt.size(1))
MODELS = {"encoder": encoder, "decoder": decoder}
