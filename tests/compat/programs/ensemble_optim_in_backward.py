# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Two memory-saving and ensembling patterns from PyTorch's tutorials in one script: a small
image-to-image net (PixelUnshuffle / PixelShuffle, CircularPad2d, nn.Unflatten, a Bilinear
gate, CosineSimilarity features) whose optimizer steps inside backward through
Tensor.register_post_accumulate_grad_hook (one optimizer per parameter, foreach=True; the
gradient freed as soon as it is used, zero_grad(set_to_none=False) elsewhere), and a model
ensemble evaluated in one call by torch.func.stack_module_state + vmap over functional_call,
trained by a fused Adam; Jacobian rows of the ensemble's mean output by autograd.grad with
is_grads_batched=True; batches built by torch.utils.data.default_collate from dicts."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap
from torch.utils.data import default_collate


class Refiner(nn.Module):
    def __init__(self, c=2, width=4):
        super().__init__()
        self.down = nn.PixelUnshuffle(2)                       # (B, c, 8, 8) -> (B, 4c, 4, 4)
        self.pad = nn.CircularPad2d(1)
        self.conv = nn.Conv2d(4 * c, width * 4, 3)
        self.up = nn.PixelShuffle(2)                          # -> (B, width, 8, 8)
        self.out = nn.Conv2d(width, c, 1)
        self.gate = nn.Bilinear(c * 64, 6, 1)
        self.unflat = nn.Unflatten(1, (c, 8, 8))
        self.sim = nn.CosineSimilarity(dim=1)

    def forward(self, x, cond):
        y = self.out(F.silu(self.up(self.conv(self.pad(self.down(x))))))
        g = torch.sigmoid(self.gate(y.flatten(1), cond))       # (B, 1)
        refined = self.unflat((x + g[:, :, None, None] * y).flatten(1))
        return refined, self.sim(refined.flatten(1), x.flatten(1))


class Member(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 1)

    def forward(self, z):
        return self.fc2(torch.tanh(self.fc1(z)))


torch.manual_seed(0)
refiner = Refiner()
optimizers = {p: torch.optim.AdamW([p], lr=2e-3, foreach=True) for p in refiner.parameters()}


def step_in_backward(p):
    optimizers[p].step()
    optimizers[p].zero_grad(set_to_none=False)


for p in refiner.parameters():
    p.register_post_accumulate_grad_hook(step_in_backward)

members = [Member() for _ in range(3)]
params, buffers = stack_module_state(members)
base = copy.deepcopy(members[0]).to("meta")
ens_opt = torch.optim.Adam(list(params.values()), lr=5e-3, fused=True)


def ensemble(z):
    return vmap(lambda p, b, z: functional_call(base, (p, b), (z,)), in_dims=(0, 0, None))(params, buffers, z)


g = torch.Generator().manual_seed(4)
LOSSES = []
for step in range(4):
    samples = [{"img": torch.randn(2, 8, 8, generator=g), "cond": torch.randn(6, generator=g),
                "target": torch.rand((), generator=g)} for _ in range(5)]
    batch = default_collate(samples)
    refined, sim = refiner(batch["img"], batch["cond"])
    loss = F.mse_loss(refined, batch["img"].roll(1, dims=-1)) + (1 - sim).mean()
    loss.backward()                                            # the refiner's optimizers step here
    preds = ensemble(batch["cond"])                            # (3 members, 5, 1)
    ens_loss = F.mse_loss(preds.squeeze(-1), batch["target"].expand(3, -1))
    ens_opt.zero_grad()
    ens_loss.backward()
    ens_opt.step()
    LOSSES += [loss.item(), ens_loss.item()]

z = torch.randn(4, 6, generator=g, requires_grad=True)
mean_out = ensemble(z).mean(0).squeeze(-1)                     # (4,)
rows, = torch.autograd.grad(mean_out, z, torch.eye(4), is_grads_batched=True)
LOSSES.append(float(rows.abs().sum()))
assert all(p.grad is not None and float(p.grad.abs().sum()) == 0.0 for p in refiner.parameters())

MODELS = {"refiner": refiner}
