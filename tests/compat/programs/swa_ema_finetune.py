# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A training recipe from the timm / torchvision reference scripts, scaled down: kaiming init via
Module.apply, AdamW (amsgrad) with per-group lrs and weight decay, OneCycleLR, clip_grad_value_,
an EMA of the weights (AveragedModel + get_ema_multi_avg_fn, updated by an optimizer step post
hook) and SWA over the last epochs (AveragedModel, SWALR, update_bn), a non-persistent buffer,
parameters_to_vector / vector_to_parameters, inference_mode, then head-only fine-tuning
(requires_grad_, add_param_group) and the optimizer state through torch.save / torch.load."""
import io

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import SWALR, AveragedModel, get_ema_multi_avg_fn, update_bn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.0),
                                      nn.Linear(16, 16), nn.GELU())
        self.head = nn.Linear(16, 3)
        self.register_buffer("scale", torch.tensor(1.5), persistent=False)

    def forward(self, x):
        return self.head(self.backbone(x)) * self.scale


def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(m.bias)


torch.manual_seed(0)
net = Net()
net.apply(init_weights)
opt = torch.optim.AdamW([{"params": net.backbone.parameters(), "lr": 1e-3},
                         {"params": net.head.parameters(), "lr": 1e-2, "weight_decay": 0.0}],
                        weight_decay=0.05, amsgrad=True)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[1e-2, 5e-2], total_steps=12, pct_start=0.3)
ema = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
ema_hook = opt.register_step_post_hook(lambda optimizer, args, kwargs: ema.update_parameters(net))
swa = AveragedModel(net)
swa_sched = SWALR(opt, swa_lr=1e-3, anneal_epochs=2, anneal_strategy="cos")
x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
loader = [(x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
LOSSES = []
for epoch in range(4):
    for xb, yb in loader:
        opt.zero_grad()
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        nn.utils.clip_grad_value_(net.parameters(), 0.5)
        opt.step()
        if epoch < 3:
            sched.step()
        LOSSES.append(loss.item())
    if epoch >= 2:
        swa.update_parameters(net)
        swa_sched.step()
    LOSSES += [g["lr"] for g in opt.param_groups]
ema_hook.remove()
update_bn(loader, swa)
LOSSES += [swa.module.backbone[1].running_mean.sum().item(), float(swa.n_averaged)]
LOSSES.append(ema.module.head.weight.sum().item())
vec = nn.utils.parameters_to_vector(net.parameters())
LOSSES.append(vec.norm().item())
nn.utils.vector_to_parameters(vec * 0.5, net.parameters())
LOSSES.append(net.head.weight.sum().item())
with torch.inference_mode():
    LOSSES += [ema(x).sum().item(), swa(x).sum().item()]
LOSSES.append(len(net.state_dict()))

net.requires_grad_(False)
net.head.requires_grad_(True)
ft = torch.optim.SGD(filter(lambda p: p.requires_grad, net.parameters()), lr=0.1)
ft.add_param_group({"params": [net.backbone[0].bias.requires_grad_()], "lr": 0.01})
net.eval()
for step in range(2):
    ft.zero_grad()
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    ft.step()
    LOSSES.append(loss.item())
buf = io.BytesIO()
torch.save(opt.state_dict(), buf)
buf.seek(0)
LOSSES.append(torch.load(buf, weights_only=True)["state"][0]["max_exp_avg_sq"].sum().item())
MODELS = {"net": net}
