"""Products vs torch: matmul's 1-D/2-D/N-D broadcasting cases, mm, bmm, dot, outer, inner,
einsum (explicit, implicit, ellipsis, diagonal, broadcasting), addmm, baddbmm, linear; every
SBP signature from the subscript helper on 2 and 3 simulated ranks; clear shape errors."""
import pytest
import torch
import torch.nn.functional as F

import holoflow as flow
from harness import BF16, F32, F64, Case, grad_of, parametrize, randn
from holoflow.core.sbp import B, P, S
from holoflow.ops.linalg import einsum_signatures

ALL3 = (F32, F64, BF16)


def ins(*shapes):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt) for s in shapes), {})


MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4,)), ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 4), (4,)),
                 ((4,), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)),
                 ((0, 4), (4, 5)), ((3, 0), (0, 5)), ((2, 3, 4), (1, 4, 2))]
CASES = [Case(f"matmul{list(a)}{list(b)}", flow.matmul, torch.matmul, ins(a, b), dtypes=ALL3)
         for a, b in MATMUL_SHAPES]
CASES += [
    Case("matmul-operator", lambda a, b: (a @ b, a.matmul(b)), lambda a, b: (a @ b, a.matmul(b)), ins((3, 4), (4, 2))),
    Case("mm", flow.mm, torch.mm, ins((3, 4), (4, 5)), dtypes=ALL3),
    Case("mm-method", lambda a, b: a.mm(b), lambda a, b: a.mm(b), ins((2, 3), (3, 2))),
    Case("bmm", flow.bmm, torch.bmm, ins((2, 3, 4), (2, 4, 5)), dtypes=ALL3),
    Case("dot", flow.dot, torch.dot, ins((5,), (5,)), dtypes=ALL3),
    Case("outer", flow.outer, torch.outer, ins((3,), (4,)), dtypes=ALL3),
    Case("inner", flow.inner, torch.inner, ins((2, 3), (4, 3))),
    Case("inner-1d", flow.inner, torch.inner, ins((3,), (3,))),
    Case("addmm", flow.addmm, torch.addmm, ins((3, 5), (3, 4), (4, 5)), dtypes=ALL3),
    Case("addmm-bcast-beta-alpha", lambda i, a, b: flow.addmm(i, a, b, beta=0.5, alpha=-2),
         lambda i, a, b: torch.addmm(i, a, b, beta=0.5, alpha=-2), ins((5,), (3, 4), (4, 5))),
    Case("addmm-col-bias", flow.addmm, torch.addmm, ins((3, 1), (3, 4), (4, 5))),
    Case("baddbmm", flow.baddbmm, torch.baddbmm, ins((2, 3, 5), (2, 3, 4), (2, 4, 5)), dtypes=ALL3),
    Case("baddbmm-bcast", lambda i, a, b: flow.baddbmm(i, a, b, beta=2, alpha=0.5),
         lambda i, a, b: torch.baddbmm(i, a, b, beta=2, alpha=0.5), ins((3, 5), (2, 3, 4), (2, 4, 5))),
    Case("linear", flow.linear, F.linear, ins((3, 4), (5, 4), (5,)), dtypes=ALL3),
    Case("linear-nobias", flow.linear, F.linear, ins((2, 3, 4), (5, 4))),
    Case("linear-1d-input", flow.linear, F.linear, ins((4,), (5, 4), (5,))),
    Case("linear-zero-batch", flow.linear, F.linear, ins((0, 4), (5, 4), (5,))),
    # (no input or no output features, as AdaptiveLogSoftmaxWithLoss's narrow tails are: the
    # backward's reshape(-1, 0) raised)
    Case("linear-zero-in-features", flow.linear, F.linear, ins((2, 3, 0), (5, 0), (5,))),
    Case("linear-zero-out-features", flow.linear, F.linear, ins((2, 3, 4), (0, 4), (0,))),
    Case("linear-zero-features-1d-input", flow.linear, F.linear, ins((0,), (5, 0))),
]
EINSUMS = [("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
           ("i,j->ij", [(3,), (4,)]), ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("ij->j", [(3, 4)]),
           ("ii->i", [(4, 4)]), ("ii", [(4, 4)]), ("ij,ij->i", [(3, 4), (3, 4)]), ("ij,jk", [(3, 4), (4, 5)]),
           ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]), ("b...,b->...", [(2, 3, 4), (2,)]),
           ("ijk,jl,k->il", [(2, 3, 4), (3, 5), (4,)]), ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),
           ("i i -> i", [(3, 3)]), ("ij,j->i", [(0, 4), (4,)])]
CASES += [Case(f"einsum[{eq}]{shapes}", lambda *xs, eq=eq: flow.einsum(eq, *xs),
               lambda *xs, eq=eq: torch.einsum(eq, *xs), ins(*shapes),
               dtypes=ALL3 if eq == "ij,jk->ik" else (F32, F64))
          for eq, shapes in EINSUMS]
CASES.append(Case("einsum-list", lambda a, b: flow.einsum("ij,jk->ik", [a, b]),
                  lambda a, b: torch.einsum("ij,jk->ik", [a, b]), ins((2, 3), (3, 2))))
CASES.append(Case("einsum-sublist", lambda a, b: (flow.einsum(a, [0, 1], b, [1, 30], [30, 0]), flow.einsum(a, [0, 1], b, [1, 2])),
                  lambda a, b: (torch.einsum(a, [0, 1], b, [1, 30], [30, 0]), torch.einsum(a, [0, 1], b, [1, 2])),
                  ins((2, 3), (3, 4))))
CASES.append(Case("einsum-sublist-ellipsis", lambda a, b: flow.einsum(a, [..., 0, 1], b, [1, 2], [..., 2, 0]),
                  lambda a, b: torch.einsum(a, [..., 0, 1], b, [1, 2], [..., 2, 0]), ins((2, 3, 4), (4, 5))))




SECOND = {
    "matmul": (lambda lib, a, b: lib.matmul(a * a, b), [(3, 4), (4, 5), (3, 5)]),
    "matmul-batched-bcast": (lambda lib, a, b: lib.matmul(a, b * b), [(2, 1, 3, 4), (5, 4, 2), (2, 5, 3, 2)]),
    "matmul-vec": (lambda lib, a, b: lib.matmul(a * a, b), [(4,), (2, 4, 5), (2, 5)]),
    "einsum-diag": (lambda lib, a, b: lib.einsum("ii,ij->j", a * a, b), [(3, 3), (3, 2), (2,)]),
    "linear": (lambda lib, a, b: (F.linear if lib is torch else flow.linear)(a * a, b), [(3, 4), (5, 4), (3, 5)]),
    "addmm": (lambda lib, a, b: lib.addmm(b, a * a, b, beta=0.5), [(3, 3), (3, 3), (3, 3)]),
}
for name, (f, shapes) in SECOND.items():
    CASES.append(Case(f"grad-of-{name}", grad_of(flow, f), grad_of(torch, f), ins(*shapes)))

globals().update(parametrize(CASES))


def test_einsum_sublist_out_of_range_is_a_value_error():
    with pytest.raises(ValueError, match=r"not within the valid range \[0, 52\)"):
        flow.einsum(flow.randn(2, 2), [0, 52])


def test_einsum_signatures_from_subscripts():
    sigs = einsum_signatures(["mk", "kn"], "mn", [(4, 6), (6, 8)])
    assert ((B, B), (B,)) in sigs
    assert ((S(0), B), (S(0),)) in sigs       # m: in a only and in the output
    assert ((B, S(1)), (S(1),)) in sigs       # n: in b only and in the output
    assert ((S(1), S(0)), (P,)) in sigs       # k: contracted, split everywhere it appears
    assert ((P, B), (P,)) in sigs and ((B, P), (P,)) in sigs
    assert len(sigs) == 6
    batched = einsum_signatures(["bmk", "bkn"], "bmn", [(2, 4, 6), (1, 6, 8)])
    assert ((S(0), B), (S(0),)) in batched    # b is broadcast (size 1) in the second operand
    with_bias = einsum_signatures(["mk", "nk"], "mn", [(4, 6), (8, 6)], addend=(8,))
    assert ((B, S(0), S(0)), (S(1),)) in with_bias and ((S(1), S(1), P), (P,)) in with_bias
    assert ((P, B, P), (P,)) in with_bias and ((B, B, P), (P,)) not in with_bias


@pytest.mark.parametrize("fn,match", [
    (lambda: flow.matmul(flow.randn(2, 3), flow.randn(4, 5)),
     r"holoflow\.matmul: shapes \(2, 3\) and \(4, 5\) cannot be multiplied: the contracted dims are 3 and 4; they must match"),
    (lambda: flow.randn(2, 3) @ flow.randn(2),
     r"holoflow\.matmul: shapes \(2, 3\) and \(2,\) cannot be multiplied"),
    (lambda: flow.matmul(flow.randn(2, 3, 4), flow.randn(3, 4, 5)),
     r"holoflow\.matmul: shapes \(2, 3, 4\) and \(3, 4, 5\) cannot be multiplied: their batch dims"),
    (lambda: flow.matmul(flow.randn(()), flow.randn(3)), r"holoflow\.matmul: both operands need at least 1 dim"),
    (lambda: flow.mm(flow.randn(2, 3), flow.randn(3)), r"holoflow\.mm: expects 2-D operands, got shapes \(2, 3\) and \(3,\)"),
    (lambda: flow.mm(flow.randn(2, 3), flow.randn(2, 3)), r"holoflow\.mm: shapes \(2, 3\) and \(2, 3\) cannot be multiplied"),
    (lambda: flow.bmm(flow.randn(2, 3, 4), flow.randn(3, 4, 5)), r"holoflow\.bmm: batch sizes of \(2, 3, 4\) and \(3, 4, 5\)"),
    (lambda: flow.dot(flow.randn(3), flow.randn(4)), r"holoflow\.dot: shapes \(3,\) and \(4,\) cannot be multiplied"),
    (lambda: flow.linear(flow.randn(2, 3), flow.randn(4, 5)), r"holoflow\.linear: input \(2, 3\) and weight \(4, 5\)"),
    (lambda: flow.addmm(flow.randn(4, 4), flow.randn(2, 3), flow.randn(3, 5)),
     r"holoflow\.addmm: .*\(4, 4\).*\(2, 5\)"),
    (lambda: flow.einsum("ij,jk->ik", flow.randn(2, 3)), r"holoflow\.einsum: 'ij,jk->ik' names 2 operands but 1"),
    (lambda: flow.einsum("ijk->i", flow.randn(2, 3)), r"holoflow\.einsum: operand 0 has shape \(2, 3\)"),
    (lambda: flow.einsum("ij,jk->ik", flow.randn(2, 3), flow.randn(4, 5)), r"holoflow\.einsum"),
])
def test_shape_errors_name_op_and_shapes(fn, match):
    with pytest.raises((ValueError, RuntimeError), match=match):
        fn()


def test_matmul_dtype_mismatch_is_clear():
    with pytest.raises(TypeError, match=r"holoflow\.matmul: operands have dtypes .*float64.*must match"):
        flow.matmul(flow.randn(2, 3), flow.randn(3, 2, dtype=flow.float64))


def test_matmul_double_backward_matches_torch():
    def run(lib, a0, b0):
        a = lib.tensor(a0, requires_grad=True)
        b = lib.tensor(b0, requires_grad=True)
        y = ((a @ b).tanh() ** 2).sum()
        ga, gb = lib.autograd.grad([y], [a, b], create_graph=True)
        z = (ga * ga).sum() + (gb ** 3).sum()
        return (ga.detach(), gb.detach(), *lib.autograd.grad([z], [a, b]))
    a0 = [[0.1, -0.2, 0.3], [0.5, 0.7, -1.1]]
    b0 = [[0.3, 0.2], [-0.4, 0.9], [1.2, -0.5]]
    for got, want in zip(run(flow, a0, b0), run(torch, a0, b0)):
        torch.testing.assert_close(got.to_torch(), want)


def test_rmatmul_and_linalg_namespace():
    a = torch.randn(3, 4)
    b = torch.randn(4, 2)
    got = flow.Tensor.__rmatmul__(flow.from_torch(b), flow.from_torch(a))
    torch.testing.assert_close(got.to_torch(), a @ b)
    torch.testing.assert_close(flow.linalg.matmul(flow.from_torch(a), flow.from_torch(b)).to_torch(), a @ b)
    torch.testing.assert_close(flow.linalg.vecdot(flow.from_torch(a), flow.from_torch(a)).to_torch(),
                               torch.linalg.vecdot(a, a))


@pytest.mark.parametrize("shape", [(3, 0, 5), (3, 4, 0)], ids=["no-inputs", "no-outputs"])
def test_compiled_linear_plus_residual_with_no_features_matches_torch(shape):
    """A traced ``linear(x) + r`` (its gradient ops, and the add-to-output fusion) with zero input
    or output features: tracing raised in linear_grad_weight's reshape(-1, 0) and fell back to eager."""
    import warnings
    n, i, o = shape
    x, w, b, r = (torch.randn(*s, dtype=torch.float64) for s in ((n, i), (o, i), (o,), (n, o)))

    def f(lib, x, w, b, r):
        return (lib.nn.functional.linear(x, w, b) + r).sin().sum()
    tx, tw, tb, tr = (t.clone().requires_grad_() for t in (x, w, b, r))
    f(torch, tx, tw, tb, tr).backward()
    fx, fw, fb, fr = (flow.from_torch(t.clone()).requires_grad_() for t in (x, w, b, r))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = flow.compile(lambda *a: f(flow, *a))
        out = compiled(fx, fw, fb, fr)
    out.backward()
    for got, want in ((fx, tx), (fw, tw), (fb, tb), (fr, tr)):
        torch.testing.assert_close(got.grad.to_torch(), want.grad)
