"""nn.init and default layer initialisation: torch's values under the same seed."""
import math

import pytest
import torch

import holoflow as flow
from holoflow import nn

SHAPES = [(5, 3), (4, 3, 2, 2), (6, 7)]


def _same(name, shape, *args, **kwargs):
    torch.manual_seed(7)
    t = torch.empty(shape)
    getattr(torch.nn.init, name)(t, *args, **kwargs)
    torch.manual_seed(7)
    f = flow.empty(*shape)
    out = getattr(nn.init, name)(f, *args, **kwargs)
    assert out is f
    torch.testing.assert_close(f.to_torch(), t, atol=0, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name,args,kwargs", [
    ("uniform_", (-0.5, 2.0), {}), ("normal_", (1.0, 0.3), {}), ("constant_", (0.7,), {}),
    ("ones_", (), {}), ("zeros_", (), {}), ("xavier_uniform_", (), {"gain": 2.0}), ("xavier_normal_", (), {}),
    ("kaiming_uniform_", (), {"a": math.sqrt(5)}), ("kaiming_uniform_", (), {"mode": "fan_out", "nonlinearity": "relu"}),
    ("kaiming_normal_", (), {"a": 0.1}), ("trunc_normal_", (), {"std": 0.02}), ("trunc_normal_", (0.5, 1.0, -1.0, 1.0), {}),
    ("orthogonal_", (), {"gain": 1.5}),
])
def test_init_matches_torch_under_seed(name, args, kwargs, shape):
    _same(name, shape, *args, **kwargs)


def test_eye_and_gain_and_errors():
    _same("eye_", (3, 5))
    for nl, p in [("linear", None), ("tanh", None), ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2),
                  ("selu", None), ("sigmoid", None), ("conv2d", None)]:
        assert nn.init.calculate_gain(nl, p) == torch.nn.init.calculate_gain(nl, p)
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        nn.init.calculate_gain("nope")
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        nn.init.xavier_uniform_(flow.empty(3))


def test_generator_and_no_grad_on_parameter():
    p = nn.Parameter(flow.empty(4, 4))
    g1, g2 = flow.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    nn.init.normal_(p, generator=g1)
    t = torch.empty(4, 4).normal_(generator=g2)
    torch.testing.assert_close(p.detach().to_torch(), t)
    assert p.is_leaf and p.requires_grad and p.grad_fn is None


def test_trunc_normal_distribution():
    torch.manual_seed(0)
    x = nn.init.trunc_normal_(flow.empty(20000), std=1.0, a=-1.0, b=1.5).to_torch()
    assert x.min() >= -1.0 and x.max() <= 1.5
    assert abs(x.mean().item() - 0.13) < 0.03  # mean of N(0,1) truncated to [-1, 1.5]


@pytest.mark.parametrize("make", [
    lambda lib: lib.Linear(7, 5), lambda lib: lib.Linear(3, 2, bias=False),
    lambda lib: lib.Conv2d(3, 4, 3), lambda lib: lib.Conv1d(4, 6, 2, groups=2),
    lambda lib: lib.ConvTranspose2d(3, 2, 3, stride=2), lambda lib: lib.Embedding(10, 4, padding_idx=2),
    lambda lib: lib.LayerNorm(6), lambda lib: lib.BatchNorm2d(3), lambda lib: lib.GroupNorm(2, 4),
    lambda lib: lib.Bilinear(3, 4, 2), lambda lib: lib.MultiheadAttention(8, 2),
    lambda lib: lib.TransformerEncoderLayer(8, 2, 16), lambda lib: lib.PReLU(3), lambda lib: lib.RMSNorm(5),
])
def test_default_init_equals_torch(make):
    torch.manual_seed(11)
    tm = make(torch.nn)
    torch.manual_seed(11)
    fm = make(nn)
    tsd, fsd = tm.state_dict(), fm.state_dict()
    assert list(tsd) == list(fsd)
    for k in tsd:
        torch.testing.assert_close(fsd[k].to_torch(), tsd[k], atol=0, rtol=0, msg=k)
    assert [p.requires_grad for p in fm.parameters()] == [p.requires_grad for p in tm.parameters()]


def test_sparse_init_matches_torch_under_one_seed():
    """nn.init.sparse_ (once missing): normal draws, then ceil(sparsity * rows) zeros per column at
    randperm rows, in torch's RNG order (also with a generator); 2-D only."""
    for gen in (None, 7):
        torch.manual_seed(0)
        want = torch.nn.init.sparse_(torch.empty(5, 4), 0.4, std=0.1,
                                     generator=None if gen is None else torch.Generator().manual_seed(gen))
        flow.manual_seed(0)
        got = flow.nn.init.sparse_(flow.empty(5, 4), 0.4, std=0.1,
                                   generator=None if gen is None else torch.Generator().manual_seed(gen))
        torch.testing.assert_close(got.to_torch(), want)
        assert int((want == 0).sum(0).min()) == 2
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions"):
        flow.nn.init.sparse_(flow.empty(2, 3, 4), 0.5)
