# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Quantization-aware training written by hand: a straight-through fake quantizer as an
autograd.Function (save_for_backward, mark_non_differentiable, a clamp mask in backward), a
learned step size through the (round(x) - x).detach() + x trick, spectral_norm on a layer,
gradient surgery by Tensor.register_hook, a forward hook collecting activation ranges and a
full backward hook scaling a module's input gradient; SGD with momentum and StepLR."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class FakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, bits):
        q = 2 ** (bits - 1) - 1
        y = torch.clamp(torch.round(x / scale), -q - 1, q)
        inside = (x / scale >= -q - 1) & (x / scale <= q)
        ctx.save_for_backward(inside)
        ctx.mark_non_differentiable(inside)
        return y * scale, inside

    @staticmethod
    def backward(ctx, grad_y, grad_inside):
        (inside,) = ctx.saved_tensors
        return grad_y * inside.to(grad_y.dtype), None, None


class LSQ(nn.Module):
    def __init__(self, bits=4):
        super().__init__()
        self.step = nn.Parameter(torch.tensor(0.1))
        self.bits = bits

    def forward(self, x):
        q = 2 ** (self.bits - 1) - 1
        v = x / self.step
        v = torch.clamp(v, -q - 1, q)
        return ((v.round() - v).detach() + v) * self.step


class QNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.utils.spectral_norm(nn.Linear(8, 16))
        self.act_q = LSQ()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = self.act_q(h)
        w, _ = FakeQuant.apply(self.fc2.weight, 0.05, 4)
        return F.linear(h, w, self.fc2.bias)


torch.manual_seed(0)
model = QNet()
ranges = []
model.fc1.register_forward_hook(lambda m, inp, out: ranges.append(float(out.detach().abs().max())))
scaled = []


def scale_input_grad(module, grad_input, grad_output):
    scaled.append(float(grad_output[0].abs().sum()))
    return (grad_input[0] * 0.5,)


model.fc2.register_full_backward_hook(scale_input_grad)
model.fc2.bias.register_hook(lambda g: g.clamp(-0.1, 0.1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, dampening=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
x = torch.randn(10, 8)
y = torch.randint(0, 4, (10,))
LOSSES = []
for step in range(4):
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
LOSSES += [sum(ranges), sum(scaled)]
MODELS = {"qnet": model}
