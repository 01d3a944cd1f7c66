"""Layers whose ``nn.functional`` function has not landed yet: these fail (loudly, naming the
missing function) until it does; then they check the layer against torch."""
import pytest
import torch

from holoflow import nn

from .helpers import compare, twin


def r(*shape):
    return lambda g: torch.randn(*shape, generator=g, dtype=torch.float64)


PENDING = {
    "dropout2d-p0": (lambda l: l.Dropout2d(0.0), [r(2, 3, 4, 4)]),
    "prelu": (lambda l: l.PReLU(3), [r(2, 3, 4)]),
    "glu": (lambda l: l.GLU(), [r(3, 6)]),
    "celu": (lambda l: l.CELU(0.5), [r(3, 4)]),
    "softsign": (lambda l: l.Softsign(), [r(3, 4)]),
    "tanhshrink": (lambda l: l.Tanhshrink(), [r(3, 4)]),
    "maxpool1d": (lambda l: l.MaxPool1d(2), [r(2, 3, 8)]),
    "avgpool1d": (lambda l: l.AvgPool1d(2), [r(2, 3, 8)]),
    "adaptivemaxpool2d": (lambda l: l.AdaptiveMaxPool2d(2), [r(2, 3, 5, 5)]),
    "pixelshuffle": (lambda l: l.PixelShuffle(2), [r(1, 8, 3, 3)]),
}


@pytest.mark.parametrize("name", list(PENDING))
def test_layer_waiting_for_functional(name):
    make, inputs = PENDING[name]
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), torch.float64)
    g = torch.Generator().manual_seed(0)
    compare(fm, tm, [f(g) for f in inputs], torch.float64)
