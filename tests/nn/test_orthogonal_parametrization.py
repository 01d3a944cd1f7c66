"""``nn.utils.parametrizations.orthogonal`` vs torch's: the weight is orthogonal and equal to
torch's for the same original and map, gradients and an SGD training step match, state-dict keys,
assignment through the trivialization, and torch's errors."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.nn.utils.parametrizations import orthogonal

MAPS = ["matrix_exp", "cayley", "householder"]
SHAPES = [(4, 4), (5, 3), (3, 5), (2, 4, 3)]


def _orth(lib):
    return torch.nn.utils.parametrizations.orthogonal if lib is torch else orthogonal


def _module(lib, w, **kw):
    lib.manual_seed(0)   # the same draws complete a non-square base in both
    m = lib.nn.Module()
    m.weight = lib.nn.Parameter(lib.tensor(w.copy()))
    return _orth(lib)(m, **kw)


def _weight(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("triv", [True, False], ids=["triv", "no-triv"])
@pytest.mark.parametrize("omap", MAPS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_weight_is_orthogonal_and_matches_torch(shape, omap, triv):
    w = _weight(shape)
    t = _module(torch, w, orthogonal_map=omap, use_trivialization=triv)
    f = _module(flow, w, orthogonal_map=omap, use_trivialization=triv)
    W = f.weight.detach().numpy()
    np.testing.assert_allclose(W, t.weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    Wt = np.swapaxes(W, -1, -2)
    gram = Wt @ W if shape[-2] >= shape[-1] else W @ Wt
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(gram.shape[-1]), gram.shape), atol=1e-5)
    assert set(f.state_dict()) == set(t.state_dict())
    for k, v in t.state_dict().items():
        np.testing.assert_allclose(f.state_dict()[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("triv", [True, False], ids=["triv", "no-triv"])
@pytest.mark.parametrize("omap", MAPS)
@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5)], ids=str)
def test_gradients_and_sgd_steps_match_torch(shape, omap, triv):
    w, x = _weight(shape), _weight((6, shape[-1]), seed=1)
    out = []
    for lib in (torch, flow):
        m = _module(lib, w, orthogonal_map=omap, use_trivialization=triv)
        opt = lib.optim.SGD(m.parameters(), lr=0.1)
        xs = lib.tensor(x)
        for _ in range(3):
            opt.zero_grad()
            ((xs @ m.weight.mT) ** 3).sum().backward()
            grad = m.parametrizations.weight.original.grad.numpy().copy()
            opt.step()
        out.append((grad, m.weight.detach().numpy()))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-5, atol=1e-5)


def test_linear_default_map_and_forward_like_torch():
    # default: matrix_exp for square matrices, householder otherwise
    for lib in (torch, flow):
        lib.manual_seed(0)
    t, f = torch.nn.Linear(3, 5), flow.nn.Linear(3, 5)
    f.load_state_dict({k: flow.tensor(v.numpy()) for k, v in t.state_dict().items()})
    torch.manual_seed(1)
    flow.manual_seed(1)
    _orth(torch)(t)
    _orth(flow)(f)
    assert f.parametrizations.weight[0].orthogonal_map == "householder"
    assert type(f).__name__ == "ParametrizedLinear"
    x = _weight((2, 3), seed=2)
    np.testing.assert_allclose(f(flow.tensor(x)).detach().numpy(), t(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    sq = flow.nn.Linear(4, 4)
    _orth(flow)(sq)
    assert sq.parametrizations.weight[0].orthogonal_map == "matrix_exp"


@pytest.mark.parametrize("omap", MAPS)
def test_assigning_a_weight_goes_through_the_trivialization(omap):
    q = np.linalg.qr(_weight((5, 3), seed=3))[0].astype(np.float32)
    res = []
    for lib in (torch, flow):
        m = _module(lib, _weight((5, 3)), orthogonal_map=omap)
        lib.manual_seed(4)
        m.weight = lib.tensor(q)
        res.append(m.weight.detach().numpy())
    np.testing.assert_allclose(res[1], res[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res[1], q, atol=1e-5)   # an orthogonal value is kept as it is


@pytest.mark.parametrize("omap", ["matrix_exp", "cayley"])
def test_assigning_without_trivialization_raises_like_torch(omap):
    for lib in (torch, flow):
        m = _module(lib, _weight((4, 4)), orthogonal_map=omap, use_trivialization=False)
        with pytest.raises(NotImplementedError, match="use_trivialization=False"):
            m.weight = lib.tensor(np.eye(4, dtype=np.float32))


def test_complex_matrix_exp_is_unitary_like_torch():
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((3, 3)) + 1j * rng.standard_normal((3, 3))).astype(np.complex64)
    t, f = _module(torch, w), _module(flow, w)
    W = f.weight.detach().numpy()
    np.testing.assert_allclose(W, t.weight.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(W.conj().T @ W, np.eye(3), atol=1e-5)


@pytest.mark.parametrize("w,kw,exc,match", [
    (np.zeros(3, np.float32), {}, ValueError, "Expected a matrix or batch of matrices"),
    (np.zeros((3, 3), np.float32), dict(orthogonal_map="qr"), ValueError, "orthogonal_map has to be one of"),
    (np.zeros((3, 3), np.complex64), dict(orthogonal_map="householder"), ValueError,
     "householder parametrization does not support complex"),
])
def test_errors_like_torch(w, kw, exc, match):
    for lib in (torch, flow):
        m = lib.nn.Module()
        m.weight = lib.nn.Parameter(lib.tensor(w))
        with pytest.raises(exc, match=match):
            _orth(lib)(m, **kw)
    with pytest.raises(ValueError, match="has no parameter or buffer with name 'w'"):
        orthogonal(flow.nn.Linear(2, 2), "w")


def test_wrong_shape_assignment_raises_like_torch():
    for lib in (torch, flow):
        m = _module(lib, _weight((4, 3)))
        with pytest.raises(ValueError, match="Expected a matrix or batch of matrices of shape"):
            m.weight = lib.zeros(3, 4)


@pytest.mark.parametrize("mode", ["RNN", "GRU", "LSTM"])
def test_recurrent_weight_of_an_rnn_layer_is_parametrized(mode):
    """nn.RNN/GRU/LSTM read their weights by attribute, as torch's ``_flat_weights``: a
    parametrized ``weight_hh_l0`` (no longer in ``_parameters``) is the orthogonal one."""
    out = []
    for lib in (torch, flow):
        lib.manual_seed(0)
        rnn = getattr(lib.nn, mode)(3, 4, batch_first=True, bidirectional=True)
        _orth(lib)(rnn, "weight_hh_l0_reverse" if mode == "LSTM" else "weight_hh_l0")
        x = lib.tensor(_weight((2, 5, 3)))
        y, _ = rnn(x)
        (y ** 2).sum().backward()
        out.append([y.detach().numpy()] + [p.grad.numpy() for p in rnn.parameters()])
    for t, f in zip(*out):
        np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-6)
