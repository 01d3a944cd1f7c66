"""Transformer-ish blocks wrapped by torch.distributed's activation-checkpoint utilities (as
torchtitan does before sharding): apply_activation_checkpointing on the blocks (non-reentrant),
a reentrant checkpoint_wrapper taking a keyword argument, an offload_wrapper, a state dict that
round-trips between the wrapped and a plain model, and torchrun's @record on the entry point."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointImpl, CheckpointWrapper,
                                                                         apply_activation_checkpointing,
                                                                         checkpoint_wrapper, offload_wrapper)
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, scale=1.0):
        return x + scale * self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d=16, n=3):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.extra = Block(d)
        self.tail = Block(d)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        x = self.extra(x, scale=0.5)
        return self.head(self.tail(x))


def build():
    torch.manual_seed(0)
    model = Net()
    plain_keys = list(model.state_dict())
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda m: isinstance(m, Block) and m is not model.extra
                                   and m is not model.tail)
    model.extra = checkpoint_wrapper(model.extra, checkpoint_impl=CheckpointImpl.REENTRANT)
    model.tail = offload_wrapper(model.tail)
    assert all(isinstance(b, CheckpointWrapper) for b in model.blocks)
    assert list(model.state_dict()) == plain_keys
    assert [n for n, _ in model.blocks[0].named_parameters()] == [n for n, _ in Block(16).named_parameters()]
    assert model.blocks[0].fc1.out_features == 64   # (attributes reach the wrapped module)
    return model


def wrapped_types(model):
    """Which submodules a policy wrapped (bottom-up: a picked module inside a picked one too)."""
    return [(name, type(m).__name__) for name, m in model.named_modules() if isinstance(m, CheckpointWrapper)]


def policies():
    by_class = Net()
    apply_activation_checkpointing(by_class, auto_wrap_policy=ModuleWrapPolicy({Block, nn.Linear}))
    by_size = Net()
    apply_activation_checkpointing(by_size, auto_wrap_policy=lambda module, recurse, nonwrapped_numel:
                                   size_based_auto_wrap_policy(module, recurse, nonwrapped_numel, min_num_params=1000))
    everything = Net()
    apply_activation_checkpointing(everything)
    return wrapped_types(by_class), wrapped_types(by_size), len(wrapped_types(everything))


@record
def main():
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 5, (8,), generator=g)
    losses = []
    for step in range(4):
        opt.zero_grad()
        loss = F.cross_entropy(model(x.requires_grad_(step % 2 == 0)), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    plain = Net()
    plain.load_state_dict(model.state_dict())   # the wrapped model's checkpoint in a plain model
    again = build()
    again.load_state_dict(plain.state_dict())   # and back
    assert torch.equal(again.blocks[1].fc2.weight, model.blocks[1].fc2.weight)
    return model, losses


model, LOSSES = main()
MODELS = {"model": model}
WRAPPED = policies()
assert WRAPPED[0][:3] == [("blocks.0", "CheckpointWrapper"), ("blocks.0._checkpoint_wrapped_module.fc1",
                                                               "CheckpointWrapper"),
                          ("blocks.0._checkpoint_wrapped_module.fc2", "CheckpointWrapper")], WRAPPED[0]
assert len(WRAPPED[1]) == 10 and WRAPPED[2] == 22, WRAPPED   # (torch's own counts)
