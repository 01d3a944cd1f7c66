# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A complex-valued network for narrow-band beamforming (the deep complex networks / complexPyTorch
style), trained end to end: the array snapshots are real (B, M, T, 2) tensors turned complex by
torch.view_as_complex, a complex linear layer whose weights are stored as real pairs and viewed as
complex (torch.view_as_complex on a parameter), complex matmul / conj / transpose (.mH), the
spatial covariance and its diagonal loading, torch.linalg.solve on the complex system (MVDR weights),
a modReLU activation (|z| and angle, rebuilt by torch.polar), torch.complex, .real / .imag,
torch.view_as_real back to real features, a phase loss through torch.angle and a magnitude loss
through .abs(); a real taper parameter cast to complex with .to(x.dtype); a real CNN branch
(Conv2d / MaxPool2d with one-element list hyper-parameters from a config); Adam with amsgrad and
ExponentialLR, the training loop run with warnings as errors; a legacy-format checkpoint (torch.save
with _use_new_zipfile_serialization=False, torch.load with a map_location function) restored into
a fresh model."""
import math
import os
import tempfile
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

M, T, B, OUT = 6, 16, 8, 4


class ComplexLinear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in, 2) / math.sqrt(2 * d_in))
        self.bias = nn.Parameter(torch.zeros(d_out, 2))

    def forward(self, z):
        w = torch.view_as_complex(self.weight)
        return z @ w.transpose(0, 1) + torch.view_as_complex(self.bias)


class ModReLU(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.b = nn.Parameter(torch.full((d,), -0.1))

    def forward(self, z):
        mag = z.abs()
        return torch.polar(F.relu(mag + self.b), z.angle())


class Beamformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.steer = ComplexLinear(M, M)
        self.act = ModReLU(M)
        self.load = nn.Parameter(torch.tensor(0.5))
        self.taper = nn.Parameter(torch.linspace(0.8, 1.2, M))      # a real array taper
        self.head = ComplexLinear(M, OUT)
        self.mag_scale = nn.Linear(2 * OUT, OUT)
        # a real CNN over the (array element, time) "image" of the I/Q channels; its hyper-parameters
        # come from a config written as lists, as YAML configs give them
        cfg = {"kernel": [3], "stride": [1], "padding": [1], "pool": [2]}
        self.cnn = nn.Conv2d(2, 4, kernel_size=cfg["kernel"] * 2, stride=cfg["stride"], padding=cfg["padding"])
        self.pool = nn.MaxPool2d(kernel_size=cfg["pool"], stride=cfg["pool"])
        self.cnn_head = nn.Linear(4 * (M // 2) * (T // 2), OUT)
        self.register_buffer("eye", torch.eye(M, dtype=torch.cfloat), persistent=False)

    def forward(self, snapshots):
        x = torch.view_as_complex(snapshots)                          # (B, M, T)
        x = x * self.taper.to(x.dtype).unsqueeze(-1)                  # real weights cast to complex
        cov = x @ x.mH / x.shape[-1]                                  # (B, M, M) Hermitian
        cov = cov + F.softplus(self.load) * self.eye
        steer = self.act(self.steer(torch.complex(torch.ones(M), torch.zeros(M))))  # (M,)
        a = steer.unsqueeze(0).unsqueeze(-1).expand(x.shape[0], M, 1)
        rinv_a = torch.linalg.solve(cov, a)                          # (B, M, 1)
        w = rinv_a / (a.conj().transpose(-2, -1) @ rinv_a)            # MVDR weights
        y = (w.conj().transpose(-2, -1) @ x).squeeze(1)               # (B, T) beamformed signal
        feats = x.mean(-1) * y.mean(-1, keepdim=True).conj()          # (B, M)
        z = self.head(feats)                                          # (B, OUT) complex
        image = snapshots.permute(0, 3, 1, 2)                         # (B, 2, M, T)
        cnn = self.cnn_head(self.pool(torch.relu(self.cnn(image))).flatten(1))
        mag = self.mag_scale(torch.view_as_real(z).flatten(1)) + 0.1 * cnn
        return z, mag, y


torch.manual_seed(0)
model = Beamformer()
opt = torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
snapshots = torch.randn(B, M, T, 2)
target_phase = torch.rand(B, OUT) * 2 * math.pi - math.pi
target_mag = torch.rand(B, OUT) + 0.5
LOSSES = []
with warnings.catch_warnings():
    warnings.simplefilter("error")     # the loop must run warning-free, as in the repo's CI
    for step in range(6):
        opt.zero_grad()
        z, mag, y = model(snapshots)
        phase_err = torch.angle(z * torch.polar(torch.ones_like(target_phase), -target_phase))
        loss = (1 - torch.cos(phase_err)).mean() + F.mse_loss(z.abs(), target_mag) + 0.1 * F.l1_loss(mag, target_mag)
        loss = loss + 1e-3 * (y.real.pow(2) + y.imag.pow(2)).mean()
        loss.backward()
        opt.step()
        sched.step()
        LOSSES.append(loss.item())
LOSSES += [y.abs().mean().item(), torch.view_as_real(z).sum().item(), z.angle().abs().mean().item()]

# an old-style checkpoint: the whole state dict plus the taper Parameter itself, saved in the
# legacy (non-zip) format and loaded back onto the CPU with the classic map_location function
ckpt_path = os.path.join(tempfile.mkdtemp(), "beamformer.pt")
torch.save({"state": model.state_dict(), "taper": model.taper}, ckpt_path, _use_new_zipfile_serialization=False)
ckpt = torch.load(ckpt_path, map_location=lambda storage, loc: storage, weights_only=True)
restored = Beamformer()
restored.load_state_dict(ckpt["state"])
restored.taper = ckpt["taper"]          # a Parameter, so it may replace the registered one
with torch.no_grad():
    LOSSES.append((restored(snapshots)[0] - model(snapshots)[0]).abs().max().item())
LOSSES.append(sorted(n for n, _ in restored.named_parameters()).index("taper"))
MODELS = {"bf": model}
