"""The ops that were ops/more_ops.py (now ops/pointwise, order_stats, histogram, linalg_solve) vs torch
through the op-table harness: fmax/fmin (NaN and ties), kthvalue, median, bincount, det/inverse and
linalg.det/inv/solve/cholesky; forward + backward (ATen's derivatives), gradcheck, SBP signatures on
simulated ranks; and their bad inputs."""
import pytest
import torch

import holoflow as flow
from harness import Case, parametrize, randn


def _m(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})


def _two(*shape, nan=False):
    def make(dt, g):
        a, b = randn(*shape, gen=g, dtype=dt), randn(*shape, gen=g, dtype=dt)
        if nan:  # NaN on either side, on both, and a tie: fmax/fmin's rules
            a.view(-1)[0], b.view(-1)[1] = float("nan"), float("nan")
            a.view(-1)[2] = b.view(-1)[2] = float("nan")
            b.view(-1)[3] = a.view(-1)[3]
        return (a, b), {}
    return make


def _wellcond(*shape):
    """Matrices far from singular: A + n * I."""
    def make(dt, g):
        a = randn(*shape, gen=g, dtype=dt)
        return (a + shape[-1] * torch.eye(shape[-1], dtype=dt),), {}
    return make


def _spd(a):
    return a @ a.transpose(-2, -1) + a.shape[-1] * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device) if isinstance(a, torch.Tensor) \
        else a @ a.transpose(-2, -1) + a.shape[-1] * flow.eye(a.shape[-1], dtype=a.dtype, device=a.device)


CASES = []
for name in ("fmax", "fmin"):
    CASES.append(Case(f"{name}[3,4]", getattr(flow, name), getattr(torch, name), _two(3, 4)))
    CASES.append(Case(f"{name}-nan[3,4]", getattr(flow, name), getattr(torch, name), _two(3, 4, nan=True),
                      gradcheck=False))
    CASES.append(Case(f"{name}-broadcast", getattr(flow, name), getattr(torch, name),
                      lambda dt, g: ((randn(3, 1, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {})))
for dim, keep in ((0, False), (1, True), (-1, False)):
    CASES.append(Case(f"kthvalue-k2-d{dim}-{keep}", lambda x, d=dim, k=keep: tuple(flow.kthvalue(x, 2, d, k)),
                      lambda x, d=dim, k=keep: tuple(torch.kthvalue(x, 2, d, k)), _m(3, 4, 5)))
    CASES.append(Case(f"median-d{dim}-{keep}", lambda x, d=dim, k=keep: tuple(flow.median(x, d, keepdim=k)),
                      lambda x, d=dim, k=keep: tuple(torch.median(x, d, keepdim=k)), _m(3, 4, 5)))
CASES.append(Case("median-all", flow.median, torch.median, _m(4, 5)))
CASES.append(Case("median-even", lambda x: tuple(flow.median(x, 0)), lambda x: tuple(torch.median(x, 0)), _m(4, 3)))
CASES.append(Case("bincount", lambda x: flow.bincount(x), lambda x: torch.bincount(x),
                  lambda dt, g: ((torch.randint(0, 7, (20,), generator=g),), {}), grad=False, dtypes=(torch.float32,)))
CASES.append(Case("bincount-weights-minlength", lambda x, w: flow.bincount(x, w, minlength=10),
                  lambda x, w: torch.bincount(x, w, minlength=10),
                  lambda dt, g: ((torch.randint(0, 7, (20,), generator=g), randn(20, gen=g, dtype=dt)), {}),
                  grad=False))
for shape in [(4, 4), (2, 3, 3)]:
    CASES.append(Case(f"linalg.det{list(shape)}", flow.linalg.det, torch.linalg.det, _m(*shape)))
    CASES.append(Case(f"det{list(shape)}", flow.det, torch.det, _m(*shape)))
    CASES.append(Case(f"linalg.inv{list(shape)}", flow.linalg.inv, torch.linalg.inv, _wellcond(*shape)))
    CASES.append(Case(f"inverse{list(shape)}", flow.inverse, torch.inverse, _wellcond(*shape)))
    CASES.append(Case(f"linalg.cholesky{list(shape)}", lambda a: flow.linalg.cholesky(_spd(a)),
                      lambda a: torch.linalg.cholesky(_spd(a)), _m(*shape)))
    CASES.append(Case(f"linalg.cholesky-upper{list(shape)}", lambda a: flow.linalg.cholesky(_spd(a), upper=True),
                      lambda a: torch.linalg.cholesky(_spd(a), upper=True), _m(*shape)))
    n = shape[-1]
    CASES.append(Case(f"linalg.solve{list(shape)}", flow.linalg.solve, torch.linalg.solve,
                      lambda dt, g, s=shape, n=n: ((_wellcond(*s)(dt, g)[0][0], randn(*s[:-1], 2, gen=g, dtype=dt)),
                                                   {})))
    CASES.append(Case(f"linalg.solve-right{list(shape)}", lambda a, b: flow.linalg.solve(a, b, left=False),
                      lambda a, b: torch.linalg.solve(a, b, left=False),
                      lambda dt, g, s=shape, n=n: ((_wellcond(*s)(dt, g)[0][0], randn(*s[:-2], 2, n, gen=g, dtype=dt)),
                                                   {})))

globals().update(parametrize(CASES))


@pytest.mark.parametrize("code, exc, words", [
    ("flow.kthvalue(flow.ones(3), 4)", RuntimeError, ["kthvalue", "k=4", "3"]),
    ("flow.kthvalue(flow.ones(3), 0)", RuntimeError, ["kthvalue", "k=0"]),
    ("flow.median(flow.ones(0))", RuntimeError, ["median", "empty"]),
    ("flow.linalg.det(flow.ones(2, 3))", RuntimeError, ["linalg.det", "square", "(2, 3)"]),
    ("flow.linalg.inv(flow.ones(3))", RuntimeError, ["linalg.inv", "(3,)"]),
    ("flow.linalg.solve(flow.ones(2, 3), flow.ones(2))", RuntimeError, ["linalg.solve", "(2, 3)"]),
    ("flow.bincount(flow.ones(2, 2, dtype=flow.int64))", RuntimeError, ["bincount", "1-D"]),
    ("flow.bincount(flow.ones(3))", RuntimeError, ["bincount", "float32"]),
    ("flow.fmax(flow.ones(2), 1.0)", TypeError, ["fmax", "float"]),
])
def test_bad_inputs_raise_torch_classes(code, exc, words):
    with pytest.raises(exc) as e:
        eval(code)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
