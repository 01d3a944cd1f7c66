# ruff: noqa: B007  (published-style loops keep their unused counters)
"""ESPCN-style super-resolution: PReLU / Hardswish / Mish convolutions, pixel_shuffle upscaling,
an antialiased bilinear downsample to make the low-resolution input, a residual bicubic
upsample, InstanceNorm2d with running stats, a frozen feature extractor (requires_grad_(False),
eval()) for a perceptual loss with F.normalize + cosine_similarity, ConvTranspose2d with
output_padding in a refinement branch, and Adamax."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ESPCN(nn.Module):
    def __init__(self, scale=2, c=8):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, c, 5, padding=2), nn.PReLU(c), nn.Conv2d(c, c, 3, padding=1),
                                  nn.InstanceNorm2d(c, affine=True, track_running_stats=True), nn.Hardswish(),
                                  nn.Conv2d(c, 3 * scale * scale, 3, padding=1))
        self.refine = nn.Sequential(nn.Conv2d(3, c, 3, stride=2, padding=1), nn.Mish(),
                                    nn.ConvTranspose2d(c, 3, 3, stride=2, padding=1, output_padding=1))
        self.scale = scale

    def forward(self, lr):
        up = F.interpolate(lr, scale_factor=self.scale, mode="bicubic", align_corners=False)
        sr = F.pixel_shuffle(self.body(lr), self.scale) + up
        return sr + 0.1 * self.refine(sr)


torch.manual_seed(0)
features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3, padding=1))
features.requires_grad_(False)
features.eval()
model = ESPCN()
opt = torch.optim.Adamax(model.parameters(), lr=2e-3, weight_decay=1e-4)
hr = torch.rand(2, 3, 8, 8)
lr_img = F.interpolate(hr, size=(4, 4), mode="bilinear", antialias=True, align_corners=False)
LOSSES = []
for step in range(4):
    opt.zero_grad()
    sr = model(lr_img)
    fa = F.normalize(features(sr).flatten(2), dim=1)
    fb = F.normalize(features(hr).flatten(2), dim=1)
    perceptual = (1 - F.cosine_similarity(fa, fb, dim=1)).mean()
    loss = F.l1_loss(sr, hr) + 0.1 * perceptual + 0.01 * F.pairwise_distance(sr.flatten(1), hr.flatten(1)).mean()
    loss.backward()
    opt.step()
    LOSSES.append(loss.item())
LOSSES.append(float(model.body[3].running_mean.sum()))
MODELS = {"espcn": model}
