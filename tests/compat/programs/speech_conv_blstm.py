# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A keyword-spotting / speech-command classifier (DeepSpeech-like front end): log-mel features
from torch.stft with a Hann window and a triangular mel filterbank, per-utterance InstanceNorm1d
over the transposed (B, n_mels, T) features, Conv1d + BatchNorm1d + Hardtanh, a 2-layer bidirectional LSTM over a padded batch via
pad_sequence and pack_padded_sequence (sorted lengths), GroupNorm over the transposed LSTM outputs, masked mean pooling, a
classification head. AdamW with weight-decay parameter groups (no decay for biases and norms), OneCycleLR with
linear three-phase annealing, clip_grad_norm_, and an eval pass with the BatchNorm running stats."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence


class ConvBlock(nn.Module):
    def __init__(self, in_ch, out_ch, kernel_size, stride):
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel_size, stride=stride, padding=kernel_size // 2, bias=False)
        self.bn = nn.BatchNorm1d(out_ch, momentum=0.2)
        self.act = nn.Hardtanh(0, 20, inplace=True)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class SpeechClassifier(nn.Module):
    def __init__(self, n_mels=8, channels=16, hidden=12, num_classes=5):
        super().__init__()
        self.stride = 2
        self.input_norm = nn.InstanceNorm1d(n_mels, affine=True)
        self.frontend = nn.Sequential(ConvBlock(n_mels, channels, 5, self.stride), ConvBlock(channels, channels, 3, 1))
        self.rnn = nn.LSTM(channels, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.norm = nn.GroupNorm(4, 2 * hidden)
        self.classifier = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.SiLU(), nn.Linear(hidden, num_classes))

    def output_lengths(self, lengths):
        return torch.div(lengths + 2 * 2 - 5, self.stride, rounding_mode="floor") + 1

    def forward(self, feats, lengths):
        # feats: (batch, time, n_mels)
        x = self.frontend(self.input_norm(feats.transpose(1, 2))).transpose(1, 2)
        out_lengths = self.output_lengths(lengths)
        packed = pack_padded_sequence(x, out_lengths.cpu(), batch_first=True)
        out, (h_n, c_n) = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
        mask = (torch.arange(x.size(1))[None, :] < out_lengths[:, None]).unsqueeze(-1).type_as(out)
        out = self.norm(out.transpose(1, 2)).transpose(1, 2)
        pooled = (out * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return self.classifier(pooled)


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name.endswith(".bias") or "norm" in name or ".bn." in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def mel_filterbank(n_freqs, n_mels, sample_rate=8000):
    def hz_to_mel(f):
        return 2595.0 * torch.log10(1.0 + f / 700.0)
    mels = torch.linspace(float(hz_to_mel(torch.tensor(0.0))), float(hz_to_mel(torch.tensor(sample_rate / 2))),
                          n_mels + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    freqs = torch.linspace(0, sample_rate / 2, n_freqs)
    down = (freqs[:, None] - hz[None, :-2]) / (hz[1:-1] - hz[:-2])[None, :]
    up = (hz[None, 2:] - freqs[:, None]) / (hz[2:] - hz[1:-1])[None, :]
    return torch.clamp(torch.minimum(down, up), min=0.0)          # (n_freqs, n_mels)


def log_mel(waveform, n_fft=64, hop=16, n_mels=8):
    spec = torch.stft(waveform, n_fft=n_fft, hop_length=hop, window=torch.hann_window(n_fft), center=True,
                      return_complex=True)
    power = spec.abs() ** 2                                      # (n_freqs, frames)
    return torch.log(power.transpose(0, 1) @ mel_filterbank(n_fft // 2 + 1, n_mels) + 1e-6)


torch.manual_seed(11)
model = SpeechClassifier()
optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
epochs, steps_per_epoch = 2, 3
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, epochs=epochs, steps_per_epoch=steps_per_epoch,
                                                pct_start=0.3, anneal_strategy="linear", three_phase=True)
criterion = nn.CrossEntropyLoss()
num_samples = torch.tensor([352, 288, 208, 128])                # sorted, as enforce_sorted=True expects
utterances = [log_mel(torch.randn(int(n)) * 0.1) for n in num_samples]
lengths = torch.tensor([u.shape[0] for u in utterances])
feats = pad_sequence(utterances, batch_first=True)              # (4, 23, 8), zero padded
labels = torch.tensor([0, 3, 1, 4])

LOSSES = []
for epoch in range(epochs):
    model.train()
    for step in range(steps_per_epoch):
        logits = model(feats, lengths)
        loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
        scheduler.step()
        LOSSES.append(loss.item())
    LOSSES.append(float(grad_norm))
    LOSSES.append(scheduler.get_last_lr()[0])
    model.eval()
    with torch.no_grad():
        eval_logits = model(feats, lengths)
        LOSSES.append(F.cross_entropy(eval_logits, labels).item())
        LOSSES.append((eval_logits.argmax(dim=-1) == labels).float().mean().item())
LOSSES.append(model.frontend[0].bn.running_var.mean().item())
LOSSES.append(float(model.frontend[0].bn.num_batches_tracked))
# one more training step so the compared gradients are the last backward's
model.train()
optimizer.zero_grad()
criterion(model(feats, lengths), labels).backward()
MODELS = {"speech": model}
