# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A Hamiltonian neural network (Greydanus et al.) for the pendulum, written with the autograd
extension points a physics codebase uses: the learned H(q, p) is differentiated with
torch.autograd.grad(create_graph=True) for the symplectic field, and again per sample through
torch.func (vmap of jacrev over functional_call with the parameters passed in, parametrized
weights included; functional_call also swapping a plain tensor attribute); a torch-2-style
autograd.Function (forward without ctx + setup_context, an output marked non-differentiable,
set_materialize_grads(False) so backward sees None for unused outputs) soft-clamps the energy; a
robust loss is an autograd.Function with @once_differentiable; a custom nn.utils.parametrize
parametrization with two originals (right_inverse returning a tuple); a tensor hook rescaling
dH/dp and retain_grad on a view of it; weight surgery on views of a parameter under
torch.no_grad; Adamax with two param groups, CyclicLR cycling the betas, clip_grad_value_, and an
optimizer + scheduler state_dict round trip mid-training (metadata carried by the optimizer's
state-dict hooks)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.func import functional_call, jacrev, vmap
from torch.nn.utils import parametrize

AUX_GRADS = {"none": 0, "tensor": 0}


class SoftClamp(torch.autograd.Function):
    """y = c * tanh(x / c), with the mask of saturated entries as a second output."""

    @staticmethod
    def forward(x, c):
        return c * torch.tanh(x / c), (x.abs() > 2 * c)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, c = inputs
        y, saturated = output
        ctx.mark_non_differentiable(saturated)
        ctx.set_materialize_grads(False)
        ctx.c = c
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, gy, g_saturated):
        AUX_GRADS["none" if g_saturated is None else "tensor"] += 1
        if gy is None:
            return None, None
        x, = ctx.saved_tensors
        return gy * (1 - torch.tanh(x / ctx.c) ** 2), None


class CauchyLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, scale):
        ctx.save_for_backward(r)
        ctx.scale = scale
        return torch.log1p((r / scale) ** 2).mean()

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        r, = ctx.saved_tensors
        return g * 2 * r / (ctx.scale ** 2 + r ** 2) / r.numel(), None


class LowRankPlusDiag(nn.Module):
    """W = U V^T + diag(d), stored as two originals."""

    def forward(self, uv, d):
        return uv + torch.diag_embed(d)[: uv.shape[0], : uv.shape[1]]

    def right_inverse(self, w):
        d = torch.diagonal(w).clone()
        return w - torch.diag_embed(d)[: w.shape[0], : w.shape[1]], d


class HNN(nn.Module):
    def __init__(self, hidden=24):
        super().__init__()
        self.inp = nn.Linear(2, hidden)
        self.mid = nn.Linear(hidden, hidden)
        parametrize.register_parametrization(self.mid, "weight", LowRankPlusDiag())
        self.out = nn.Linear(hidden, 1, bias=False)
        self.energy_unit = torch.tensor(1.0)      # a plain tensor attribute (not a buffer)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = F.softplus(self.mid(h), beta=2.0)
        return self.out(h) * self.energy_unit


def true_field(x):
    q, p = x[:, 0], x[:, 1]
    return torch.stack([p, -torch.sin(q)], dim=1)


def symplectic(dhdq, dhdp):
    return torch.stack([dhdp, -dhdq], dim=1)


torch.manual_seed(0)
model = HNN()
x = torch.cat([torch.rand(32, 1) * 4 - 2, torch.randn(32, 1)], dim=1)
target = true_field(x)


def make_opt(model):
    opt = torch.optim.Adamax([{"params": [model.inp.weight, model.inp.bias], "lr": 5e-3},
                              {"params": [p for n, p in model.named_parameters() if not n.startswith("inp.")]}],
                             lr=1e-2, betas=(0.9, 0.99), weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=[2e-3, 4e-3], max_lr=[8e-3, 2e-2], step_size_up=2,
                                              mode="triangular2", cycle_momentum=True, base_momentum=0.8,
                                              max_momentum=0.95)
    return opt, sched


opt, sched = make_opt(model)
LOSSES = []
for step in range(8):
    opt.zero_grad()
    xs = x.clone().requires_grad_()
    energy = model(xs)
    soft, saturated = SoftClamp.apply(energy, 0.1)
    dh, = torch.autograd.grad(soft.sum(), xs, create_graph=True)
    dh.register_hook(lambda g: g * torch.tensor([1.0, 0.5]))       # damp the dH/dp branch
    dhdq = dh[:, 0]
    dhdq.retain_grad()
    field = symplectic(dhdq, dh[:, 1])
    loss = CauchyLoss.apply(field - target, 0.5) + 1e-3 * soft.pow(2).mean()
    loss.backward()
    nn.utils.clip_grad_value_(model.parameters(), clip_value=0.2)
    opt.step()
    sched.step()
    LOSSES += [loss.item(), dhdq.grad.abs().sum().item() * 100, float(saturated.sum()),
               opt.param_groups[1]["lr"], opt.param_groups[0]["betas"][0]]
    if step == 3:
        with torch.no_grad():      # prune the weakest readout weights, reset the diagonal part
            w = model.out.weight
            w[:, :12].mul_((w[:, :12].abs() > w.abs().median()).float())
            model.mid.parametrizations.weight.original1[::2].fill_(0.1)
        # checkpoint metadata travels in the optimizer's state dict through state-dict hooks
        opt.register_state_dict_post_hook(lambda o, sd: {**sd, "meta": {"n_state": len(sd["state"])}})
        state = {"opt": opt.state_dict(), "sched": sched.state_dict()}
        opt, sched = make_opt(model)
        opt.register_load_state_dict_pre_hook(lambda o, sd: LOSSES.append(sd.pop("meta")["n_state"]))
        opt.register_load_state_dict_post_hook(lambda o: LOSSES.append(len(o.state)))
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
LOSSES += [AUX_GRADS["none"], AUX_GRADS["tensor"]]

# the same field per sample through torch.func, with the parameters passed in
params = {k: v.detach() for k, v in model.named_parameters()}
per_sample = vmap(jacrev(lambda p, xi: functional_call(model, p, (xi.unsqueeze(0),)).squeeze(), argnums=1),
                  in_dims=(None, 0))
dh_func = per_sample(params, x)
# the same in other energy units: functional_call swaps the plain attribute for the call
in_kj = functional_call(model, {**params, "energy_unit": torch.tensor(1e-3)}, (x,))
LOSSES += [(in_kj * 1e3 - model(x)).abs().max().item() < 1e-5, model.energy_unit.item()]
with torch.no_grad():
    LOSSES.append(model.mid.weight.abs().sum().item())
xs = x.clone().requires_grad_()
dh_auto, = torch.autograd.grad(model(xs).sum(), xs)
LOSSES += [(dh_func - dh_auto).abs().max().item() < 1e-5, dh_func.abs().sum().item()]
LOSSES.append(sorted(model.state_dict().keys()).index("mid.parametrizations.weight.original1"))
MODELS = {"hnn": model}
