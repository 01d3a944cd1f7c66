# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A speech-enhancement step in the frequency domain: stft with a hann window, magnitude and
phase via abs/angle, a dilated Conv1d mask estimator with reflect padding, the masked spectrum
rebuilt with torch.polar and inverted by istft, an L1 + multi-resolution spectral loss, Adam with
a LambdaLR warm-up and gradients clipped by norm."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MaskNet(nn.Module):
    def __init__(self, bins, hidden=16):
        super().__init__()
        self.inp = nn.Conv1d(bins, hidden, 1)
        self.blocks = nn.ModuleList([nn.Conv1d(hidden, hidden, 3, dilation=d) for d in (1, 2)])
        self.out = nn.Conv1d(hidden, bins, 1)

    def forward(self, mag):
        h = F.gelu(self.inp(torch.log1p(mag)))
        for conv in self.blocks:
            d = conv.dilation[0]
            h = h + F.silu(conv(F.pad(h, (d, d), mode="reflect")))
        return torch.sigmoid(self.out(h))


def spectral_loss(x, y, n_fft):
    w = torch.hann_window(n_fft)
    sx = torch.stft(x, n_fft, hop_length=n_fft // 4, window=w, return_complex=True).abs()
    sy = torch.stft(y, n_fft, hop_length=n_fft // 4, window=w, return_complex=True).abs()
    return torch.linalg.norm(sy - sx) / torch.linalg.norm(sy) + F.l1_loss(torch.log(sx + 1e-5), torch.log(sy + 1e-5))


torch.manual_seed(0)
n_fft, hop, length = 32, 8, 256
t = torch.arange(length, dtype=torch.float32) / 100
clean = torch.stack([torch.sin(2 * math.pi * 3.0 * t), torch.sin(2 * math.pi * 5.0 * t) * 0.5])
noisy = clean + 0.3 * torch.randn(2, length)
window = torch.hann_window(n_fft)
model = MaskNet(n_fft // 2 + 1)
opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.8, 0.99))
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
LOSSES = []
for step in range(4):
    opt.zero_grad()
    spec = torch.stft(noisy, n_fft, hop_length=hop, window=window, return_complex=True)
    mag, phase = spec.abs(), spec.angle()
    mask = model(mag)
    est = torch.istft(torch.polar(mag * mask, phase), n_fft, hop_length=hop, window=window, length=length)
    loss = F.l1_loss(est, clean) + sum(spectral_loss(est, clean, n) for n in (16, 32))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, norm_type=2.0)
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
MODELS = {"masknet": model}
