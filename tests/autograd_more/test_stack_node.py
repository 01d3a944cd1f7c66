"""``stack`` records one node, as torch's ``StackBackward0`` (holoflow's name: ``<StackBackward>``),
against torch run live: each input is one edge of it, so hooks on the stacked tensors fire in
torch's order (a reshape per input, then a cat, fired them last-made first: 3, 2, 1, 0 where torch
gives 0, 2, 1, 3), ``next_functions`` is torch's, and values, gradients, dtypes and views of the
result written in place are torch's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow

LIBS = (torch, flow)


def _name(node) -> str:
    """A node's name in holoflow's spelling (torch's ``MulBackward0`` is ``<MulBackward>``)."""
    if node is None:
        return "None"
    n = node.name().replace("torch::autograd::", "").replace("CopySlices", "ViewScatterBackward0")
    return n if n.startswith("<") else f"<{n.removesuffix('0')}>"


def _leaves(lib, n: int, shape=(2,)) -> list:
    rng = np.random.default_rng(n)
    return [lib.tensor(rng.standard_normal(shape), dtype=lib.float32, requires_grad=True) for _ in range(n)]


def _hook_order(lib, n: int, use: str) -> list:
    xs, order = _leaves(lib, n), []
    ins = xs if use != "mixed" else [x * (i + 1.0) if i % 2 else x for i, x in enumerate(xs)]
    for i, t in enumerate(ins):
        t.register_hook(lambda g, i=i: order.append(i))
    if use == "mixed":   # every other input a non-leaf, whose leaf has a hook too
        for i, x in enumerate(xs):
            x.register_hook(lambda g, i=i: order.append(f"x{i}"))
    y = (lib.stack(ins) * lib.arange(1.0, 2.0 * n + 1).reshape(n, 2)).sum()
    if use == "other":   # the inputs also used elsewhere, before and after the stack
        y = y + ins[0].sin().sum() + (ins[-1] * ins[n // 2]).sum()
    y.backward()
    return order


@pytest.mark.parametrize("use", ["alone", "other", "mixed"])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_hooks_on_stacked_tensors_fire_in_torchs_order(n, use):
    want, got = _hook_order(torch, n, use), _hook_order(flow, n, use)
    assert got == want


def test_stack_has_torchs_node_and_next_functions():
    got = {}
    for lib in LIBS:
        a, b = _leaves(lib, 2)
        c = a * 2.0
        s = lib.stack([a, c, b.detach(), a], 1)
        fn = s.grad_fn
        got[lib] = (_name(fn), [(_name(f), i) for f, i in fn.next_functions], fn.next_functions[0][0].variable is a,
                    fn.next_functions[1][0] is c.grad_fn, fn.next_functions[3][0] is fn.next_functions[0][0])
    assert got[flow] == got[torch]
    assert got[flow][0] == "<StackBackward>"


def _case(lib, shape, dtypes):
    rng = np.random.default_rng(len(shape) * 7 + len(dtypes))
    return [lib.tensor(rng.standard_normal(shape), dtype=getattr(lib, dt), requires_grad=dt != "int64")
            if dt != "int64" else lib.tensor(rng.integers(-3, 3, shape)) for dt in dtypes]


DTYPES = [("float32", "float32"), ("float64", "float64", "float64"), ("float32", "float64"),
          ("bfloat16", "float32"), ("complex64", "complex64"), ("int64", "float32")]


@pytest.mark.parametrize("dtypes", DTYPES, ids=["-".join(d) for d in DTYPES])
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 1, 3)])
def test_stack_values_and_gradients_match_torch_for_every_dim(shape, dtypes):
    nd = len(shape) + 1
    for dim in range(-nd, nd):
        res = {}
        for lib in LIBS:
            xs = _case(lib, shape, dtypes)
            y = lib.stack(xs, dim)
            w = lib.arange(1.0, y.numel() + 1.0).reshape(tuple(y.shape)).to(y.dtype)
            z = y * w
            (z.abs() if z.dtype.is_complex else z).sum().backward()
            res[lib] = (y.detach(), [x.grad for x in xs], str(y.dtype).split(".")[-1], _name(y.grad_fn))
        (yf, gf, df, nf), (yt, gt, dt, nt) = res[flow], res[torch]
        assert df == dt and tuple(yf.shape) == tuple(yt.shape) and nf == nt == "<StackBackward>", (dim, nf)
        np.testing.assert_array_equal(np.asarray(yf.tolist()), np.asarray(yt.tolist()))
        for a, b in zip(gf, gt):
            assert (a is None) == (b is None)
            if a is not None:
                assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
                np.testing.assert_allclose(np.asarray(a.tolist()), np.asarray(b.tolist()), rtol=1e-6)


WRITES = {
    "row_mul_": lambda L, s, w: s[0].mul_(2.0),
    "col_add_": lambda L, s, w: s[:, 1].add_(w[1:]),
    "whole_view_": lambda L, s, w: s.view(-1).mul_(3.0),
    "transposed_copy_": lambda L, s, w: s.t()[2].copy_(w[:2] * w[:2]),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_views_of_a_stacked_result_written_in_place(write):
    res = {}
    for lib in LIBS:
        a, b = _leaves(lib, 2, (3,))
        w = lib.tensor([0.5, -1.0, 2.0], requires_grad=True)
        s = lib.stack([a, b * b])
        keep = s[1]   # another view of the result, read after the write
        WRITES[write](lib, s, w)
        (s * lib.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])).sum().backward(retain_graph=True)
        (keep * keep).sum().backward()
        assert [_name(s.grad_fn), _name(s.grad_fn.next_functions[0][0])] == ["<ViewScatterBackward>", "<StackBackward>"]
        res[lib] = (s.tolist(), a.grad.tolist(), b.grad.tolist(), None if w.grad is None else w.grad.tolist())
    for g, t in zip(res[flow], res[torch]):
        np.testing.assert_allclose(np.asarray(g, dtype=float), np.asarray(t, dtype=float), rtol=1e-6)


def test_unbind_backward_through_stack_and_double_backward():
    res = {}
    for lib in LIBS:
        a, b = _leaves(lib, 2, (3,))
        s = lib.stack([a.sin(), b], 0)
        g, = lib.autograd.grad((s * s * s).sum(), [a], create_graph=True)
        g.sum().backward()
        u0, u1 = lib.stack([a, b], 1).unbind(1)
        assert [_name(u0.grad_fn), _name(u0.grad_fn.next_functions[0][0])] == ["<UnbindBackward>", "<StackBackward>"]
        (u0 * u1).sum().backward()
        res[lib] = (g.tolist(), a.grad.tolist(), b.grad.tolist())
    for g, t in zip(res[flow], res[torch]):
        np.testing.assert_allclose(g, t, rtol=1e-5)
