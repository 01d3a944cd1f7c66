# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Fine-tuning with model surgery and attribution, as an applied team's notebook does it: a small
CNN backbone is frozen (requires_grad_(False)) after its classifier is swapped by setattr through
named_modules and its ReLUs made out-of-place by apply(); Grad-CAM captures the last conv block's
activations with a forward hook and their gradients with register_full_backward_hook;
integrated gradients of the input by autograd.grad over a batch of interpolated inputs; the
trainable head (and, from the third step, the unfrozen last block in a second param group with
its own lr) is trained by Adam; a deepcopy of the model carries its hooks; per-class logits
through an nn.ModuleDict of heads."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True))
        self.block = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2))
        self.classifier = nn.Linear(6 * 4 * 4, 10)

    def forward(self, x):
        return self.classifier(self.block(self.stem(x)).flatten(1))


def no_inplace(m):
    if isinstance(m, nn.ReLU):
        m.inplace = False


torch.manual_seed(0)
model = Backbone()
model.apply(no_inplace)                             # full backward hooks refuse in-place outputs
for name, module in list(model.named_modules()):
    if name == "classifier":
        setattr(model, name, nn.ModuleDict({"coarse": nn.Linear(96, 2), "fine": nn.Linear(96, 3)}))
model.forward = lambda x: {k: h(model.block(model.stem(x)).flatten(1)) for k, h in model.classifier.items()}

store = {}
model.block.register_forward_hook(lambda m, i, o: store.__setitem__("act", o))
model.block.register_full_backward_hook(lambda m, gi, go: store.__setitem__("grad", go[0]))

model.requires_grad_(False)
model.classifier.requires_grad_(True)
opt = torch.optim.Adam(model.classifier.parameters(), lr=1e-2)

g = torch.Generator().manual_seed(9)
LOSSES = []
for step in range(5):
    if step == 2:                                    # unfreeze the last block, lower lr
        model.block.requires_grad_(True)
        opt.add_param_group({"params": list(model.block.parameters()), "lr": 2e-3})
    x = torch.randn(6, 1, 8, 8, generator=g)
    yc, yf = torch.randint(0, 2, (6,), generator=g), torch.randint(0, 3, (6,), generator=g)
    x.requires_grad_(True)                           # (so the block's full backward hook fires while frozen)
    out = model(x)
    loss = F.cross_entropy(out["coarse"], yc) + F.cross_entropy(out["fine"], yf)
    opt.zero_grad()
    loss.backward()
    opt.step()
    weights = store["grad"].mean(dim=(2, 3), keepdim=True)
    cam = F.relu((weights * store["act"]).sum(1))
    LOSSES += [loss.item(), cam.sum().item()]

# integrated gradients of the fine head's top class for one image
model.eval()
x0 = torch.randn(1, 1, 8, 8, generator=g)
alphas = torch.linspace(0, 1, 5).view(-1, 1, 1, 1)
path = (alphas * x0).requires_grad_(True)
target = model(x0)["fine"].argmax()
grads, = torch.autograd.grad(model(path)["fine"][:, target].sum(), path)
LOSSES.append(float((x0 * grads.mean(0)).sum()))

twin = copy.deepcopy(model)
store.clear()
twin(torch.randn(2, 1, 8, 8, generator=g))["coarse"].sum()
LOSSES.append(float(len(store)))                     # the copy's forward hook still writes into store

MODELS = {"model": model}
