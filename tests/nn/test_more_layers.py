"""Layers built on the nn.functional functions of ops/dropout.py, activation.py, pooling.py, ..., each
against its torch twin with copied weights: outputs, input and parameter gradients (float64)."""
import pytest
import torch

import holoflow as flow
from holoflow import nn

from .helpers import compare, twin


def r(*shape, low=None):
    """A float64 input draw; ``low`` makes it positive (>= low)."""
    def make(g):
        t = torch.randn(*shape, generator=g, dtype=torch.float64)
        return t if low is None else t.abs() + low
    return make


def sign(*shape, dtype=torch.float64):
    """Targets of +-1 (an integer dtype where torch gives the target no gradient)."""
    return lambda g: (torch.randint(0, 2, shape, generator=g) * 2 - 1).to(dtype)


LAYERS = {
    "dropout1d-p0": (lambda l: l.Dropout1d(0.0), [r(2, 3, 5)]),
    "dropout2d-p0": (lambda l: l.Dropout2d(0.0), [r(2, 3, 4, 4)]),
    "dropout3d-p0": (lambda l: l.Dropout3d(0.0), [r(2, 3, 2, 2, 2)]),
    "alphadropout-p0": (lambda l: l.AlphaDropout(0.0), [r(3, 4)]),
    "prelu": (lambda l: l.PReLU(3), [r(2, 3, 4)]),
    "prelu-shared": (lambda l: l.PReLU(), [r(2, 3, 4, 2)]),
    "glu": (lambda l: l.GLU(), [r(3, 6)]),
    "glu-dim1": (lambda l: l.GLU(1), [r(2, 4, 3)]),
    "celu": (lambda l: l.CELU(0.5), [r(3, 4)]),
    "softsign": (lambda l: l.Softsign(), [r(3, 4)]),
    "tanhshrink": (lambda l: l.Tanhshrink(), [r(3, 4)]),
    "logsigmoid": (lambda l: l.LogSigmoid(), [r(3, 4)]),
    "maxpool1d": (lambda l: l.MaxPool1d(2), [r(2, 3, 8)]),
    "maxpool1d-stride-pad": (lambda l: l.MaxPool1d(3, 2, 1, ceil_mode=True), [r(2, 3, 8)]),
    "avgpool1d": (lambda l: l.AvgPool1d(2), [r(2, 3, 8)]),
    "avgpool1d-pad": (lambda l: l.AvgPool1d(3, 2, 1, count_include_pad=False), [r(3, 7)]),
    "adaptiveavgpool1d": (lambda l: l.AdaptiveAvgPool1d(3), [r(2, 3, 8)]),
    "adaptivemaxpool1d": (lambda l: l.AdaptiveMaxPool1d(3), [r(2, 3, 8)]),
    "adaptivemaxpool2d": (lambda l: l.AdaptiveMaxPool2d(2), [r(2, 3, 5, 5)]),
    "adaptivemaxpool2d-rect": (lambda l: l.AdaptiveMaxPool2d((3, None)), [r(3, 5, 4)]),
    "pixelshuffle": (lambda l: l.PixelShuffle(2), [r(1, 8, 3, 3)]),
    "pixelunshuffle": (lambda l: l.PixelUnshuffle(2), [r(1, 2, 4, 6)]),
    "pairwisedistance": (lambda l: l.PairwiseDistance(), [r(4, 5), r(4, 5)]),
    "pairwisedistance-p1-keepdim": (lambda l: l.PairwiseDistance(1.0, keepdim=True), [r(4, 5), r(4, 5)]),
    "bilinear": (lambda l: l.Bilinear(3, 4, 2), [r(5, 3), r(5, 4)]),
    "marginrankingloss": (lambda l: l.MarginRankingLoss(0.2), [r(6), r(6), sign(6)]),
    "cosineembeddingloss": (lambda l: l.CosineEmbeddingLoss(0.1, reduction="sum"), [r(5, 4), r(5, 4), sign(5, dtype=torch.int64)]),
    "gaussiannllloss": (lambda l: l.GaussianNLLLoss(full=True), [r(4, 3), r(4, 3), r(4, 1, low=0.3)]),
    "poissonnllloss": (lambda l: l.PoissonNLLLoss(full=True), [r(3, 4), r(3, 4, low=0.5)]),
    "poissonnllloss-rates": (lambda l: l.PoissonNLLLoss(log_input=False, reduction="none"),
                             [r(3, 4, low=0.1), r(3, 4, low=0.5)]),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_matches_torch(name):
    make, inputs = LAYERS[name]
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), torch.float64)
    g = torch.Generator().manual_seed(0)
    compare(fm, tm, [f(g) for f in inputs], torch.float64)


@pytest.mark.parametrize("name, make, shape", [
    ("dropout1d", lambda l: l.Dropout1d(0.4), (4, 6, 5)),
    ("dropout2d", lambda l: l.Dropout2d(0.4), (4, 6, 3, 3)),
    ("dropout3d", lambda l: l.Dropout3d(0.4), (6, 2, 2, 3)),
    ("alphadropout", lambda l: l.AlphaDropout(0.3), (5, 7)),
])
def test_dropout_layers_draw_like_torch_and_are_identity_in_eval(name, make, shape):
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), torch.float64)
    x = torch.randn(*shape, dtype=torch.float64)
    flow.manual_seed(7)
    got = fm(flow.from_torch(x.clone()))
    torch.manual_seed(7)
    want = tm(x.clone())
    torch.testing.assert_close(got.to_torch(), want)
    assert not torch.equal(want, x)  # the draw dropped something, so the comparison says something
    fm.eval()
    torch.testing.assert_close(fm(flow.from_torch(x.clone())).to_torch(), x)


def test_adaptive_max_pool_layer_returns_indices_like_torch():
    fm, tm = twin(lambda: nn.AdaptiveMaxPool2d((2, 3), return_indices=True),
                  lambda: torch.nn.AdaptiveMaxPool2d((2, 3), return_indices=True), torch.float64)
    x = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    (out, idx), (tout, tidx) = fm(flow.from_torch(x)), tm(x)
    torch.testing.assert_close(out.to_torch(), tout)
    assert torch.equal(idx.to_torch(), tidx)
