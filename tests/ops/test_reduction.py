"""Reductions and scans vs torch: dims (None, int, tuple, negative), keepdim, dtype=, ties,
zeros, zero-size tensors; grad ops validated through second-order cases; clear dim errors."""
import pytest
import torch

import holoflow as flow
from holoflow.core.dispatch import apply
from holoflow.ops.reduction import AT_INDEX_GATHER
from harness import (BF16, F32, F64, Case, error_like_torch, grad_of, parametrize, positive, randn,
                     torch_differentiates)

ALL3 = (F32, F64, BF16)


_AMINMAX_GRAD = torch_differentiates(lambda x: torch.aminmax(x, dim=0), torch.zeros(2))


def _torch_aminmax(x):
    """torch.aminmax(x, dim=1), or where the installed torch has no derivative for it (2.11)
    amin and amax: the same values, and the gradient ATen's aminmax got (each output's, shared
    evenly among ties, as amin's and amax's)."""
    return tuple(torch.aminmax(x, dim=1)) if _AMINMAX_GRAD else (torch.amin(x, 1), torch.amax(x, 1))


def x_of(*shape, fn=randn):
    return lambda dt, g: ((fn(*shape, gen=g, dtype=dt),), {})


def reduce_cases(name, dims, shapes=((3, 4, 5),), dtypes=ALL3, fn=randn, **kw):
    cases = []
    for shape in shapes:
        for dim in dims:
            for keep in (False, True):
                if dim is None and name in ("max", "min", "prod") and keep:  # torch has no such form
                    continue
                args = {} if dim is None and not keep else {"dim": dim, "keepdim": keep}
                if dim is None and keep and name in ("argmax", "argmin"):
                    args = {"dim": None, "keepdim": True}
                cases.append(Case(f"{name}{list(shape)}-dim{dim}-keep{keep}",
                                  lambda x, a=args, n=name: getattr(flow, n)(x, **a),
                                  lambda x, a=args, n=name: getattr(torch, n)(x, **a),
                                  x_of(*shape, fn=fn), dtypes=dtypes, **kw))
    return cases


CASES = []
CASES += reduce_cases("sum", [None, 1, -1, (0, 2), (-1, 0)], shapes=((3, 4, 5), (0, 3, 2)))
CASES += reduce_cases("mean", [None, 1, (0, 2)])
CASES += reduce_cases("mean", [(0, 2), -1], shapes=((2, 0, 3),))
CASES += reduce_cases("mean", [None, 1], shapes=((2, 0, 3),), gradcheck=False)  # nan: the mean of nothing
CASES += reduce_cases("amax", [1, (0, -1)], gradcheck=False)
CASES += reduce_cases("amin", [1, (0, -1)], gradcheck=False)
CASES += reduce_cases("max", [None, 0, -1], gradcheck=False)
CASES += reduce_cases("min", [None, 2], gradcheck=False)
CASES += reduce_cases("argmax", [None, 1], grad=False)
CASES += reduce_cases("argmin", [None, -1], grad=False)
CASES += reduce_cases("prod", [None, 1], shapes=((3, 4, 2),), fn=positive)
CASES += reduce_cases("logsumexp", [1, (0, 2)])
CASES += reduce_cases("all", [None, 1], grad=False, dtypes=(F32,))
CASES += reduce_cases("any", [None, (0, 2)], grad=False, dtypes=(F32,))
CASES += [
    Case("sum-dtype-f64", lambda x: flow.sum(x, 1, dtype=flow.float64), lambda x: torch.sum(x, 1, dtype=torch.float64),
         x_of(3, 4), dtypes=(F32, BF16)),
    Case("sum-int", lambda x: x.sum(0), lambda x: x.sum(0),
         lambda dt, g: ((torch.arange(12, dtype=torch.int32).reshape(3, 4),), {}), grad=False, dtypes=(F32,)),
    Case("sum-0d", lambda x: (x.sum(), x.sum(0), x.mean(-1)), lambda x: (x.sum(), x.sum(0), x.mean(-1)), x_of()),
    Case("sum-bool", lambda x: (x > 0).sum(1), lambda x: (x > 0).sum(1), x_of(3, 4), grad=False, dtypes=(F32,)),
    Case("mean-dtype", lambda x: flow.mean(x, (0,), dtype=flow.float64), lambda x: torch.mean(x, (0,), dtype=torch.float64),
         x_of(4, 3), dtypes=(F32,)),
    Case("nansum", lambda x: flow.nansum(x, 1), lambda x: torch.nansum(x, 1),
         lambda dt, g: ((torch.tensor([[1.0, float("nan")], [2.0, 3.0]], dtype=dt),), {}), gradcheck=False),
    Case("max-ties", lambda x: (x.max(), flow.amax(x, 1)), lambda x: (x.max(), torch.amax(x, 1)),
         lambda dt, g: ((torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], dtype=dt),), {}), gradcheck=False),
    Case("max-dim-ties", lambda x: flow.max(x, 1), lambda x: torch.max(x, 1),
         lambda dt, g: ((torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], dtype=dt),), {}), gradcheck=False),
    Case("max-binary", lambda a, b: flow.max(a, b), lambda a, b: torch.max(a, b),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {})),
    Case("min-0d-dim", lambda x: flow.min(x, 0), lambda x: torch.min(x, 0), x_of(), gradcheck=False),
    Case("aminmax", lambda x: tuple(flow.aminmax(x, dim=1)), _torch_aminmax, x_of(3, 5), gradcheck=False),
    Case("aminmax-ties", lambda x: tuple(flow.aminmax(x, dim=1)), _torch_aminmax,
         lambda dt, g: ((torch.tensor([[1.0, 3.0, 3.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]], dtype=dt),), {}),
         gradcheck=False),
    Case("prod-zeros", lambda x: (x.prod(), x.prod(1), x.prod(0, keepdim=True)),
         lambda x: (x.prod(), x.prod(1), x.prod(0, keepdim=True)),
         lambda dt, g: ((torch.tensor([[0.0, 2.0, 3.0], [0.0, 0.0, 1.5], [1.0, 2.0, -1.0]], dtype=dt),), {})),
    Case("prod-int", lambda x: (x.prod(), x.prod(1)), lambda x: (x.prod(), x.prod(1)),
         lambda dt, g: ((torch.arange(1, 7, dtype=torch.int32).reshape(2, 3),), {}), grad=False, dtypes=(F32,)),
    Case("count_nonzero", lambda x: (flow.count_nonzero(x), flow.count_nonzero(x, (0, 2)), flow.count_nonzero(x, -1)),
         lambda x: (torch.count_nonzero(x), torch.count_nonzero(x, (0, 2)), torch.count_nonzero(x, -1)),
         lambda dt, g: ((randn(3, 4, 2, gen=g, dtype=dt).round(),), {}), grad=False, dtypes=(F32,)),
]
for corr in ({}, {"correction": 0}, {"unbiased": False}, {"correction": 2}):
    for dim in (None, 1, (0, 2)):
        for fn in ("var", "std"):
            args = dict(corr, **({} if dim is None else {"dim": dim, "keepdim": dim == 1}))
            CASES.append(Case(f"{fn}-{corr}-dim{dim}", lambda x, a=args, f=fn: getattr(flow, f)(x, **a),
                              lambda x, a=args, f=fn: getattr(torch, f)(x, **a), x_of(3, 4, 5), dtypes=ALL3))
CASES += [
    Case("var_mean", lambda x: flow.var_mean(x, 1, keepdim=True), lambda x: torch.var_mean(x, 1, keepdim=True), x_of(3, 4)),
    Case("std_mean", lambda x: flow.std_mean(x, (0, 1), correction=0), lambda x: torch.std_mean(x, (0, 1), correction=0),
         x_of(3, 4)),
    Case("var-positional-unbiased", lambda x: x.var(False), lambda x: x.var(False), x_of(3, 4)),
]
for p in (2, 1, 3, float("inf"), float("-inf"), 0):
    for dim in (None, 1, (0, 1)):
        CASES.append(Case(f"vector_norm-ord{p}-dim{dim}", lambda x, p=p, d=dim: flow.linalg.vector_norm(x, p, d),
                          lambda x, p=p, d=dim: torch.linalg.vector_norm(x, p, d), x_of(3, 4, 2),
                          dtypes=ALL3, gradcheck=p not in (float("inf"), float("-inf"))))
CASES += [
    Case("norm-fro", lambda x: (x.norm(), flow.norm(x, "fro", dim=(0, 1)), x.norm(1, dim=1, keepdim=True)),
         lambda x: (x.norm(), torch.norm(x, "fro", dim=(0, 1)), x.norm(1, dim=1, keepdim=True)), x_of(3, 4)),
    Case("norm-at-zero", lambda x: flow.linalg.vector_norm(x, 2, 1), lambda x: torch.linalg.vector_norm(x, 2, 1),
         lambda dt, g: ((torch.tensor([[0.0, 0.0], [3.0, 4.0]], dtype=dt),), {}), gradcheck=False),
    # 0 < ord < 1 and negative ords: |x|^(ord - 1) is inf at a zero entry; torch's gradient there is 0
    Case("norm-fractional-ord-at-zero", lambda x: tuple(flow.linalg.vector_norm(x, p, 1) for p in (0.5, -1, 1.5)),
         lambda x: tuple(torch.linalg.vector_norm(x, p, 1) for p in (0.5, -1, 1.5)),
         lambda dt, g: ((torch.tensor([[0.0, 1.0, -2.0], [0.5, 0.0, 0.0], [1.0, -3.0, 0.5]], dtype=dt),), {}),
         gradcheck=False),
    Case("matrix_norm", lambda x: tuple(flow.linalg.matrix_norm(x, o) for o in ("fro", 1, -1, float("inf"), float("-inf"))),
         lambda x: tuple(torch.linalg.matrix_norm(x, o) for o in ("fro", 1, -1, float("inf"), float("-inf"))),
         x_of(2, 3, 4), gradcheck=False),
    Case("linalg-norm", lambda x: (flow.linalg.norm(x), flow.linalg.norm(x, 3, dim=1), flow.linalg.norm(x, "fro", dim=(0, 1))),
         lambda x: (torch.linalg.norm(x), torch.linalg.norm(x, 3, dim=1), torch.linalg.norm(x, "fro", dim=(0, 1))),
         x_of(3, 4)),
]
for name in ("cumsum", "cumprod"):
    for shape, dim in (((3, 4, 5), 1), ((6,), 0), ((3, 4), -1), ((0, 3), 1), ((), 0)):
        CASES.append(Case(f"{name}{list(shape)}-dim{dim}", lambda x, n=name, d=dim: getattr(flow, n)(x, d),
                          lambda x, n=name, d=dim: getattr(torch, n)(x, d), x_of(*shape), dtypes=ALL3))
CASES += [
    Case("cumprod-zeros", lambda x: x.cumprod(1), lambda x: x.cumprod(1),
         lambda dt, g: ((torch.tensor([[1.5, 0.0, 2.0, 0.0, 3.0], [0.0, 2.0, 1.5, -1.0, 2.0], [2.0, 1.0, 0.5, 3.0, 0.0]],
                                      dtype=dt),), {})),
    Case("cumsum-dtype", lambda x: flow.cumsum(x, 0, dtype=flow.float64), lambda x: torch.cumsum(x, 0, dtype=torch.float64),
         x_of(4, 3), dtypes=(F32,)),
    Case("cumsum-int", lambda x: flow.cumsum(x, 0), lambda x: torch.cumsum(x, 0),
         lambda dt, g: ((torch.arange(6, dtype=torch.int32),), {}), grad=False, dtypes=(F32,)),
]


# -- gradients as forward functions: the grad ops' SBP rules are validated, and backward of
#    these cases is a double backward compared against torch --------------------------------
def grad_of1(lib, f):
    """``harness.grad_of`` of a one-input function: its one gradient."""
    g = grad_of(lib, f)
    return lambda x, dy: g(x, dy)[0]


SECOND = {
    "sum": lambda lib, x: (x * x).sum((0, 2)),
    "mean": lambda lib, x: (x * x).mean(1, keepdim=True),
    "amax": lambda lib, x: lib.amax(x * x, 1),
    "max-dim": lambda lib, x: (x * x).max(2)[0],
    "min-dim-keep": lambda lib, x: (x * x).min(0, keepdim=True)[0],
    "prod": lambda lib, x: (x * x).prod(1),
    "var": lambda lib, x: (x * x).var(2),
    "logsumexp": lambda lib, x: lib.logsumexp(x * x, 1),
    "vector_norm": lambda lib, x: lib.linalg.vector_norm(x * x, 3, 2),
    "cumsum": lambda lib, x: (x * x).cumsum(1),
    "cumprod": lambda lib, x: (x * x).cumprod(2),
}
for name, f in SECOND.items():
    CASES.append(Case(f"grad-of-{name}", grad_of1(flow, f), grad_of1(torch, f),
                      lambda dt, g, f=f: ((randn(3, 4, 5, gen=g, dtype=dt),
                                           randn(*f(torch, torch.zeros(3, 4, 5)).shape, gen=g, dtype=dt)), {}),
                      gradcheck=name not in ("amax", "max-dim", "min-dim-keep")))

# max/min's grad scatters at the returned indices; its own grad gathers there (second order)
_at_index_gather = lambda x, i: apply(AT_INDEX_GATHER, x, i, dim=1, keepdim=False)  # noqa: E731
CASES.append(Case("at_index_gather", _at_index_gather, lambda x, i: x.gather(1, i.unsqueeze(1)).squeeze(1),
                  lambda dt, g: ((randn(3, 4, 2, gen=g, dtype=dt), torch.randint(0, 4, (3, 2), generator=g)), {})))

globals().update(parametrize(CASES))


@pytest.mark.parametrize("fn", [lambda x: flow.sum(x, 3), lambda x: x.mean(-4), lambda x: flow.amax(x, (0, 5)),
                                lambda x: x.max(3), lambda x: flow.argmax(x, -4), lambda x: x.cumsum(3),
                                lambda x: x.prod(7), lambda x: x.var(3), lambda x: flow.logsumexp(x, 9)])
def test_bad_dim_names_op_and_range(fn):
    x = flow.randn(2, 3, 4)
    with pytest.raises(IndexError, match=r"holoflow\.\w+: dim -?\d+ is out of range .* legal dims are -3\.\.2"):
        fn(x)


def test_repeated_dim_raises():
    with pytest.raises(RuntimeError, match="holoflow.sum: dim .* more than once"):
        flow.sum(flow.randn(2, 3), (1, -1))


@pytest.mark.parametrize("ord_", [2, "fro", float("inf")])
def test_linalg_norm_with_ord_and_no_dim_needs_1d_or_2d_like_torch(ord_):
    """torch does not guess whether a 3-D input's norm is a vector or a matrix one."""
    err = error_like_torch(lambda lib: lib.linalg.norm(lib.ones(2, 3, 4), ord_), "linalg.norm of a 3-D input")
    assert "must be 1D or 2D" in str(err)


def test_max_of_empty_dim_raises_with_op_name():
    with pytest.raises((RuntimeError, IndexError), match="holoflow.max"):
        flow.max(flow.randn(0, 3), 0)


def test_sum_mean_double_backward_matches_torch():
    def run(lib, x0):
        x = lib.tensor(x0, requires_grad=True)
        y = (x.sum(1) ** 2).mean() + (x * x).mean(0).sum()
        (g,) = lib.autograd.grad([y], [x], create_graph=True)
        (gg,) = lib.autograd.grad([(g ** 3).sum()], [x])
        return g.detach(), gg
    x0 = [[0.1, -0.2, 0.3], [0.5, 0.7, -1.1]]
    for got, want in zip(run(flow, x0), run(torch, x0)):
        torch.testing.assert_close(got.to_torch(), want)


def test_max_dim_returns_namedtuple():
    r = flow.max(flow.tensor([[1.0, 5.0], [7.0, 2.0]]), 1)
    assert r.values.tolist() == [5.0, 7.0] and r.indices.tolist() == [1, 0]
    v, i = flow.min(flow.tensor([[1.0, 5.0], [7.0, 2.0]]), 0)
    assert v.tolist() == [1.0, 2.0] and i.tolist() == [0, 1]


def test_aminmax_reference_without_torch_derivative_is_atens():
    """amin and amax, the reference under torch 2.11, have aminmax's gradient in the installed
    torch, ties included (run where torch has one)."""
    if not _AMINMAX_GRAD:
        pytest.skip("the installed torch has no derivative for aminmax")
    x0 = torch.tensor([[1.0, 3.0, 3.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    g = torch.Generator().manual_seed(0)
    ups = (torch.randn(2, generator=g), torch.randn(2, generator=g))
    grads = []
    for fn in (lambda x: tuple(torch.aminmax(x, dim=1)), lambda x: (torch.amin(x, 1), torch.amax(x, 1))):
        x = x0.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(x), x, ups)[0])
    assert torch.equal(*grads)
