"""``out=`` as torch takes it (holoflow/ops/out_arg.py), against torch: the result written into the
given tensor and returned, resized and cast as torch does, refused where torch refuses (a dtype
the function doesn't take, autograd recording), several results into a tuple. holoflow refused
every ``out=`` with a bare TypeError ("unexpected keyword argument 'out'")."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import holoflow as flow

X = np.arange(12.0).reshape(3, 4) / 5 - 1

# (name, args of lib and x: the (3, 4) float32 tensor of X)
FUNCTIONS = [
    ("add", lambda m, x: (m.add, (x, x), {"alpha": 2})),
    ("exp", lambda m, x: (m.exp, (x,), {})),
    ("matmul", lambda m, x: (m.matmul, (x, x.t()), {})),
    ("mm", lambda m, x: (m.mm, (x, x.t()), {})),
    ("cat", lambda m, x: (m.cat, ([x, x],), {"dim": 1})),
    ("sum dim", lambda m, x: (m.sum, (x, 0), {})),
    ("mean dim", lambda m, x: (m.mean, (x, 1), {"keepdim": True})),
    ("cumsum", lambda m, x: (m.cumsum, (x, 1), {})),
    ("where", lambda m, x: (m.where, (x > 0, x, -x), {})),
    ("clamp", lambda m, x: (m.clamp, (x, -0.5, 0.5), {})),
    ("softmax", lambda m, x: (m.softmax, (x, 1), {})),
    ("eq", lambda m, x: (m.eq, (x, x.abs()), {})),
    ("argmax", lambda m, x: (m.argmax, (x,), {"dim": 1})),
    ("take", lambda m, x: (m.take, (x, m.tensor([0, 5, 11])), {})),
    ("linalg.norm", lambda m, x: (m.linalg.norm, (x,), {"dim": 1})),
    ("special.erf", lambda m, x: (m.special.erf, (x,), {})),
    ("fft.fft", lambda m, x: (m.fft.fft, (x,), {})),
]


def _outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the class is what the test compares
        return e


def _call(lib, case, out_spec):
    fn, args, kwargs = dict(FUNCTIONS)[case](lib, lib.tensor(X, dtype=lib.float32))
    dtype, shape = out_spec
    out = lib.full(shape, 7, dtype=getattr(lib, dtype)) if shape else lib.empty(0, dtype=getattr(lib, dtype))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs, out=out)
    return result is out, str(out.dtype).split(".")[-1], out.tolist(), len(caught)


@pytest.mark.parametrize("out_spec", [("float32", None), ("float64", None), ("int64", None), ("float16", None),
                                      ("complex64", None), ("float32", (2, 2))],
                         ids=["float32", "float64", "int64", "float16", "complex64", "wrong shape"])
@pytest.mark.parametrize("case", [c for c, _ in FUNCTIONS])
def test_out_takes_the_result_as_torch(case, out_spec):
    want = _outcome(lambda: _call(torch, case, out_spec))
    got = _outcome(lambda: _call(flow, case, out_spec))
    if isinstance(want, BaseException):
        assert type(got) is type(want), f"torch raised {want!r}; holoflow gave {got!r}"
        assert "holoflow" in str(got) and "out" in str(got)
        return
    assert not isinstance(got, BaseException), f"torch took it; holoflow raised {got!r}"
    (w_same, w_dtype, w_values, w_warned), (g_same, g_dtype, g_values, g_warned) = want, got
    assert (g_same, g_dtype, g_warned > 0) == (w_same, w_dtype, w_warned > 0)
    np.testing.assert_allclose(np.asarray(g_values), np.asarray(w_values), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["max dim", "sort", "topk", "linalg.slogdet"])
def test_out_of_several_results_is_a_tuple_returned_as_torchs(case):
    calls = {"max dim": lambda m, x: m.max(x, 1, out=(m.empty(0), m.empty(0, dtype=m.int64))),
             "sort": lambda m, x: m.sort(x, 0, out=(m.empty(0), m.empty(0, dtype=m.int64))),
             "topk": lambda m, x: m.topk(x, 2, out=(m.empty(0), m.empty(0, dtype=m.int64))),
             "linalg.slogdet": lambda m, x: m.linalg.slogdet(x[:, :3], out=(m.empty(0), m.empty(0)))}
    results = []
    for lib in (torch, flow):
        r = calls[case](lib, lib.tensor(X, dtype=lib.float32))
        fields = {"linalg.slogdet": ("sign", "logabsdet")}.get(case, ("values", "indices"))
        assert all(getattr(r, f) is r[i] for i, f in enumerate(fields))
        results.append([t.tolist() for t in r])
    for g, w in zip(*results):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_out_given_a_tensor_where_a_tuple_goes_is_refused_as_torch():
    for lib in (torch, flow):
        with pytest.raises(TypeError):
            lib.topk(lib.tensor(X), 2, out=lib.empty(0))


def test_out_refused_while_autograd_records_unless_the_function_is_not_differentiable():
    for lib in (torch, flow):
        x = lib.tensor(X, requires_grad=True)
        with pytest.raises(RuntimeError, match="out=.*automatic differentiation"):
            lib.exp(x, out=lib.empty(0))
        with lib.no_grad():
            assert lib.exp(x, out=lib.empty(0)).requires_grad is False
        mask = lib.gt(x, 0, out=lib.empty(0, dtype=lib.bool))    # (no gradient: torch takes it)
        assert mask.tolist() == (X > 0).tolist()


def test_out_that_is_an_input_or_a_view_takes_the_result():
    """``add(x, 1, out=x)`` reads x before writing it; ``out=big[1]`` writes through to big."""
    values = []
    for lib in (torch, flow):
        x = lib.tensor(X)
        lib.add(x, x.flip(1), out=x)
        big = lib.zeros(3, 3, 4)
        lib.mul(x, 2, out=big[1])
        values.append((x.tolist(), big.tolist()))
    assert values[1] == values[0]
