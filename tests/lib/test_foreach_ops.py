"""torch._foreach_* (every one torch has) against torch: each overload form (a number, one per
tensor, tensor lists, a single tensor, a tensor of scalars), in-place writes, gradients of the
out-of-place forms, and torch's error classes for bad lists."""
from __future__ import annotations

import pytest
import torch

import holoflow as flow

SHAPES = [(3,), (2, 2), ()]
# unary ops on values in their domain
DOMAIN = {"acos": (-0.9, 0.9), "asin": (-0.9, 0.9), "log": (0.5, 2), "log10": (0.5, 2), "log1p": (0.5, 2),
          "log2": (0.5, 2), "sqrt": (0.5, 2), "rsqrt": (0.5, 2), "reciprocal": (0.5, 2), "lgamma": (0.5, 2)}
UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
         "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin",
         "sinh", "sqrt", "tan", "tanh", "trunc"]


def _lists(lib, low=-2.0, high=2.0, seed=0, k=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(k):
        ts = [torch.rand(s, generator=g, dtype=torch.float64) * (high - low) + low for s in SHAPES]
        out.append(ts if lib is torch else [flow.from_torch(t) for t in ts])
    return out


def _plain(x):
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x.to_torch() if isinstance(x, flow.Tensor) else x


def _same(fn, **lists):
    """``fn(lib, *lists)`` in both libraries: equal results, and equal first lists (in-place writes)."""
    outs = []
    for lib in (torch, flow):
        args = _lists(lib, **lists)
        res = fn(lib, *args)
        outs.append((_plain(res), _plain(args[0])))
    (tr, ta), (fr, fa) = outs
    assert len(tr) == len(fr)
    for a, b in zip(fr, tr):
        torch.testing.assert_close(a, b)
    for a, b in zip(fa, ta):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("inplace", [False, True])
def test_unary(name, inplace):
    low, high = DOMAIN.get(name, (-2.0, 2.0))
    fname = f"_foreach_{name}{'_' if inplace else ''}"
    _same(lambda lib, xs: getattr(lib, fname)(xs), low=low, high=high)


BINARY_FORMS = {
    "number": lambda lib, xs, ys: (0.75,),
    "numbers": lambda lib, xs, ys: ([0.5, -1.5, 2.0],),
    "tensors": lambda lib, xs, ys: (ys,),
}


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "clamp_min", "clamp_max", "maximum", "minimum", "pow"])
@pytest.mark.parametrize("form", list(BINARY_FORMS))
@pytest.mark.parametrize("inplace", [False, True])
def test_binary(name, form, inplace):
    fname = f"_foreach_{name}{'_' if inplace else ''}"
    low = 0.5 if name == "pow" else -2.0
    _same(lambda lib, xs, ys: getattr(lib, fname)(xs, *BINARY_FORMS[form](lib, xs, ys)), k=2, low=low)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("inplace", [False, True])
def test_a_single_tensor_and_alpha(name, inplace):
    fname = f"_foreach_{name}{'_' if inplace else ''}"
    _same(lambda lib, xs: getattr(lib, fname)(xs, lib.tensor(1.25, dtype=lib.float64)))
    if name in ("add", "sub"):
        _same(lambda lib, xs, ys: getattr(lib, fname)(xs, ys, alpha=-0.5), k=2)


@pytest.mark.parametrize("inplace", [False, True])
def test_lerp_addcmul_addcdiv(inplace):
    s = "_" if inplace else ""
    for weight in (0.3, [0.1, 0.5, 0.9]):
        _same(lambda lib, xs, ys, w=weight: getattr(lib, f"_foreach_lerp{s}")(xs, ys, w), k=2)
    _same(lambda lib, xs, ys, ws: getattr(lib, f"_foreach_lerp{s}")(xs, ys, ws), k=3, low=0.0, high=1.0)
    for name in ("addcmul", "addcdiv"):
        fn = f"_foreach_{name}{s}"
        _same(lambda lib, xs, a, b, fn=fn: getattr(lib, fn)(xs, a, b), k=3, low=0.5)
        _same(lambda lib, xs, a, b, fn=fn: getattr(lib, fn)(xs, a, b, value=-2.0), k=3, low=0.5)
        _same(lambda lib, xs, a, b, fn=fn: getattr(lib, fn)(xs, a, b, [1.0, -1.0, 0.5]), k=3, low=0.5)
        _same(lambda lib, xs, a, b, fn=fn: getattr(lib, fn)(xs, a, b, lib.tensor([1.0, -1.0, 0.5])), k=3, low=0.5)


def test_reductions_copies_and_products():
    for ord_ in (2, 1, 3, float("inf"), 0):
        _same(lambda lib, xs, o=ord_: lib._foreach_norm(xs, o))
        _same(lambda lib, xs, o=ord_: lib._foreach_powsum(xs, o))
    _same(lambda lib, xs: lib._foreach_norm([x.float() for x in xs], 2, dtype=lib.float64))
    _same(lambda lib, xs: lib._foreach_max(xs))
    _same(lambda lib, xs: lib._foreach_clone(xs))
    _same(lambda lib, xs: lib._foreach_zero_(xs))
    _same(lambda lib, xs, ys: lib._foreach_copy_(xs, ys), k=2)
    _same(lambda lib, xs: lib._foreach_pow(2.0, xs))
    _same(lambda lib, xs, ys: lib._foreach_mm([x.reshape(-1, 1) for x in xs], [y.reshape(1, -1) for y in ys]), k=2)


def test_out_of_place_forms_are_differentiable():
    grads = []
    for lib in (torch, flow):
        xs, ys = _lists(lib, k=2, low=0.5)
        xs = [x.requires_grad_() for x in xs]
        prods = lib._foreach_mul(lib._foreach_exp(xs), ys)
        total = sum(n for n in lib._foreach_norm(lib._foreach_add(prods, 1.0)))
        total.backward()
        grads.append([_plain(x.grad) for x in xs])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_in_place_forms_return_the_list_they_wrote():
    for lib in (torch, flow):
        xs, ys = _lists(lib, k=2)
        assert lib._foreach_abs_(xs) is xs and lib._foreach_maximum_(xs, ys) is xs and lib._foreach_zero_(xs) is xs
        assert lib._foreach_addcmul_(xs, ys, ys, [1.0, 2.0, 3.0]) is xs and lib._foreach_copy_(xs, ys) is xs


def test_bad_lists_raise_torchs_classes():
    for lib in (torch, flow):
        xs, ys = _lists(lib, k=2)
        with pytest.raises(RuntimeError, match="same number of tensors"):
            lib._foreach_add(xs, ys[:2])
        with pytest.raises(RuntimeError, match="at least one tensor"):
            lib._foreach_exp([])
        with pytest.raises(TypeError):
            lib._foreach_exp(xs[0])
