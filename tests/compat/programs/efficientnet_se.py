# ruff: noqa: B007  (published-style loops keep their unused counters)
"""An EfficientNet-B0-like classifier in the style of torchvision's efficientnet.py: Conv-BN-SiLU stems,
MBConv blocks (1x1 expand, depthwise 3x3 / 5x5 with stride, squeeze-and-excitation through
adaptive_avg_pool2d + two 1x1 convs with SiLU and sigmoid gating, 1x1 project), stochastic depth on the
residual branch ("row" mode: a per-sample Bernoulli keep mask from torch.empty().bernoulli_ divided by the
survival rate) growing linearly with depth, the model and inputs in torch.channels_last memory format,
BatchNorm with eps=1e-3 / momentum=0.01, Hardswish in the head, Dropout, kaiming_normal_(mode="fan_out")
and uniform_ init as torchvision does, label-smoothed CrossEntropyLoss, RMSprop(eps=0.0316, alpha=0.9)
with ExponentialLR, and an eval pass comparing a contiguous_format copy of the model."""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def stochastic_depth(input, p, mode, training=True):
    if not training or p == 0.0:
        return input
    survival_rate = 1.0 - p
    size = [input.shape[0]] + [1] * (input.ndim - 1) if mode == "row" else [1] * input.ndim
    noise = torch.empty(size, dtype=input.dtype, device=input.device)
    noise = noise.bernoulli_(survival_rate)
    if survival_rate > 0.0:
        noise.div_(survival_rate)
    return input * noise


class ConvBNAct(nn.Sequential):
    def __init__(self, cin, cout, k, stride=1, groups=1, act=nn.SiLU):
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01)]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, input_channels, squeeze_channels):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = nn.SiLU()
        self.scale_activation = nn.Sigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class MBConv(nn.Module):
    def __init__(self, cin, cout, expand, k, stride, sd_prob):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers.append(ConvBNAct(cin, hidden, 1))
        layers += [ConvBNAct(hidden, hidden, k, stride, groups=hidden),
                   SqueezeExcitation(hidden, max(1, cin // 4)),
                   ConvBNAct(hidden, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)
        self.stochastic_depth_prob = sd_prob

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result = stochastic_depth(result, self.stochastic_depth_prob, "row", self.training)
            result = result + x
        return result


class EfficientNet(nn.Module):
    def __init__(self, num_classes=6, stochastic_depth_prob=0.3):
        super().__init__()
        cfg = [(1, 3, 1, 8, 8, 1), (4, 3, 2, 8, 12, 2), (4, 5, 1, 12, 16, 2)]
        total = sum(c[-1] for c in cfg)
        layers = [ConvBNAct(3, 8, 3, stride=2)]
        block_id = 0
        for expand, k, stride, cin, cout, n in cfg:
            for i in range(n):
                sd = stochastic_depth_prob * float(block_id) / total
                layers.append(MBConv(cin if i == 0 else cout, cout, expand, k, stride if i == 0 else 1, sd))
                block_id += 1
        layers.append(ConvBNAct(16, 32, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.2, inplace=True), nn.Linear(32, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                init_range = 1.0 / math.sqrt(m.out_features)
                nn.init.uniform_(m.weight, -init_range, init_range)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


torch.manual_seed(4)
model = EfficientNet().to(memory_format=torch.channels_last)
assert model.features[0][0].weight.is_contiguous(memory_format=torch.channels_last)
images = torch.randn(6, 3, 16, 16).to(memory_format=torch.channels_last)
labels = torch.tensor([0, 1, 2, 3, 4, 5])
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
optimizer = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, eps=0.0316, momentum=0.9, weight_decay=1e-5)
scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.97)

LOSSES = []
model.train()
for step in range(4):
    out = model(images)
    loss = criterion(out, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    LOSSES.append(loss.item())
    LOSSES.append(float(out.is_contiguous(memory_format=torch.channels_last) or out.dim() == 2))

model.eval()
contiguous = copy.deepcopy(model).to(memory_format=torch.contiguous_format)
with torch.no_grad():
    feats = model.features(images)
    LOSSES.append(float(feats.is_contiguous(memory_format=torch.channels_last)))
    a = model(images)
    b = contiguous(images.contiguous())
    LOSSES.append((a - b).abs().max().item() * 1e3)
    LOSSES.append(F.softmax(a, dim=1).max(dim=1).values.mean().item())
LOSSES.append(model.features[1].block[0][1].running_mean.abs().sum().item())
MODELS = {"effnet": model}
