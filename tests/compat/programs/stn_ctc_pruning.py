# ruff: noqa: B007  (published-style loops keep their unused counters)
"""PyTorch's spatial-transformer tutorial feeding a small CTC recognizer, then its pruning
tutorial: affine_grid + grid_sample (border padding) behind a localization net initialised to the
identity, ReflectionPad2d, InstanceNorm2d with running stats, PReLU, a grouped circular-padded
conv, PixelShuffle, Upsample, ConvTranspose2d with output_size, unfold / fold, CTCLoss
(zero_infinity) on log-probs, RMSprop (centered, momentum); torch.nn.utils.prune (L1 and random
unstructured, ln_structured, global_unstructured) during training, prune.remove at the end."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.utils.prune as prune


class STNRecognizer(nn.Module):
    def __init__(self, n_classes=5):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2, ceil_mode=True), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 6))
        self.loc[-1].weight.data.zero_()
        self.loc[-1].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))
        self.features = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(1, 8, 3, bias=False),
            nn.InstanceNorm2d(8, affine=True, track_running_stats=True), nn.PReLU(8),
            nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=4, padding_mode="circular"), nn.PixelShuffle(2),
            nn.Upsample(scale_factor=0.5, mode="bilinear", align_corners=False))
        self.up = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)
        self.classifier = nn.Linear(3 * 6, n_classes)

    def stn(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)

    def forward(self, x):
        h = self.up(self.features(self.stn(x)), output_size=(12, 12))
        h = F.fold(F.unfold(h, kernel_size=2, stride=2), output_size=(12, 12), kernel_size=2, stride=2)
        seq = h.mean(2).permute(2, 0, 1)                                # (T=12, N, C=3)
        seq = torch.cat([seq, seq.roll(1, 0)], -1).repeat(1, 1, 3)
        return F.log_softmax(self.classifier(seq), -1)


torch.manual_seed(0)
net = STNRecognizer()
opt = torch.optim.RMSprop(net.parameters(), lr=1e-3, centered=True, momentum=0.5)
ctc = nn.CTCLoss(blank=0, zero_infinity=True)
x = torch.randn(3, 1, 12, 12)
targets = torch.tensor([[1, 2, 2, 3], [4, 1, 0, 0], [3, 3, 1, 0]])
input_lengths, target_lengths = torch.tensor([12, 10, 11]), torch.tensor([4, 2, 3])
LOSSES = []
for step in range(5):
    if step == 2:   # prune after warm-up; the optimizer keeps training the *_orig parameters
        prune.l1_unstructured(net.classifier, "weight", amount=0.3)
        prune.random_unstructured(net.up, "weight", amount=0.2)
        prune.ln_structured(net.features[4], "weight", amount=0.25, n=2, dim=0)
        prune.global_unstructured([(net.features[1], "weight"), (net.classifier, "weight")],
                                  pruning_method=prune.L1Unstructured, amount=0.1)
        opt = torch.optim.RMSprop(net.parameters(), lr=1e-3, centered=True, momentum=0.5)
    opt.zero_grad()
    loss = ctc(net(x), targets, input_lengths, target_lengths)
    loss.backward()
    opt.step()
    LOSSES += [loss.item(), net.features[2].running_mean.sum().item()]
LOSSES.append(float(prune.is_pruned(net)))
for module, name in [(net.classifier, "weight"), (net.up, "weight"), (net.features[4], "weight"),
                     (net.features[1], "weight")]:
    LOSSES.append(float((getattr(module, name) == 0).sum()))
    prune.remove(module, name)
LOSSES += [float(prune.is_pruned(net)), float(len(net.state_dict()))]
net.eval()
with torch.no_grad():
    LOSSES.append(net(x).exp().sum(-1).mean().item())
net.train()
net.zero_grad()
ctc(net(x), targets, input_lengths, target_lengths).backward()
MODELS = {"net": net}
