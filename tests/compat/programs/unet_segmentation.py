# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A small U-Net for segmentation: conv / batch-norm / ReLU blocks, max-pool down, transposed conv
and bilinear interpolation up, skip connections by cat, Dropout2d, weighted cross-entropy with an
ignored label, SGD with Nesterov momentum and weight decay, StepLR, clip_grad_value_."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    def __init__(self, classes=3, w=8):
        super().__init__()
        self.d1, self.d2, self.mid = block(1, w), block(w, 2 * w), block(2 * w, 4 * w)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2)
        self.u2 = block(4 * w, 2 * w)
        self.u1 = block(3 * w, w)
        self.drop = nn.Dropout2d(0.1)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        x1 = self.d1(x)
        x2 = self.d2(F.max_pool2d(x1, 2))
        m = self.mid(F.max_pool2d(x2, 2))
        y = self.u2(torch.cat([self.up2(m), x2], dim=1))
        y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        y = self.u1(torch.cat([y, x1], dim=1))
        return self.head(self.drop(y))


torch.manual_seed(0)
model = UNet()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
weights = torch.tensor([0.5, 1.0, 2.0])
x = torch.randn(4, 1, 16, 16)
target = (x[:, 0] > 0.3).long() + (x[:, 0] > 1.0).long()
target[:, :2, :2] = -1   # unlabelled corner
LOSSES = []
model.train()
for step in range(4):
    opt.zero_grad()
    logits = model(x)
    loss = F.cross_entropy(logits, target, weight=weights, ignore_index=-1)
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
model.eval()
with torch.no_grad():
    pred = model(x).argmax(1)
    valid = target >= 0
    LOSSES.append((pred[valid] == target[valid]).float().mean().item())
    LOSSES.append(model.d1[1].running_var.sum().item())
MODELS = {"unet": model}
