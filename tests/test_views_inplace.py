"""Views x in-place ops, against torch: values and gradients, eager and nn.Graph.

Every view op is combined with every in-place family: the write goes through the view into its
base, and autograd follows torch (the base's history is rebased onto the write; other views of
the base see it). The same programs compiled as an inference nn.Graph give torch's values.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow

# a view of a 12-element base (reshaped to 3x4 first where the view needs 2-d)
VIEWS = {
    "slice": lambda b: b[1:],
    "step_slice": lambda b: b[::2],
    "index": lambda b: b.view(3, 4)[1],
    "narrow": lambda b: b.narrow(0, 2, 6),
    "select": lambda b: b.view(3, 4).select(1, 2),
    "view": lambda b: b.view(3, 4),
    "reshape": lambda b: b.reshape(2, 6),
    "t": lambda b: b.view(3, 4).t(),
    "transpose": lambda b: b.view(2, 2, 3).transpose(0, 2),
    "permute": lambda b: b.view(2, 2, 3).permute(2, 0, 1),
    "unsqueeze": lambda b: b.unsqueeze(0),
    "squeeze": lambda b: b.view(1, 12, 1).squeeze(),
    "flatten": lambda b: b.view(3, 4).flatten(),
    "diagonal": lambda b: b.view(3, 4).diagonal(),
    "split": lambda b: b.split(5)[1],
    "chunk": lambda b: b.view(3, 4).chunk(2, dim=1)[1],
    "unbind": lambda b: b.view(3, 4).unbind(0)[2],
    "view_of_view": lambda b: b.view(2, 6)[1:].t()[2:],
}

# in-place writes on a view v; c is another input that requires grad (same shape as v)
INPLACE = {
    "mul_scalar": lambda v, c: v.mul_(2.0),
    "add_tensor": lambda v, c: v.add_(c * 5),
    "mul_tensor": lambda v, c: v.mul_(c),
    "exp": lambda v, c: v.exp_(),
    "sigmoid": lambda v, c: v.sigmoid_(),
    "clamp": lambda v, c: v.clamp_(min=-0.5, max=0.5),
    "zero": lambda v, c: v.zero_(),
    "fill": lambda v, c: v.fill_(3.0),
    "div_tensor": lambda v, c: v.div_(c.abs() + 1),
    "neg": lambda v, c: v.neg_(),
    "setitem": lambda v, c: v.__setitem__(0, c[0] * 3),
    "copy": lambda v, c: v.copy_(c * 2),
    "iadd": lambda v, c: v.__iadd__(c),
}


def _program(lib, view, write, a, c_full):
    """b = a * 1 (a non-leaf base); write through a view; a later view sees it; reduce."""
    b = a * 1
    v = VIEWS[view](b)
    other = b[:3]                       # a view taken before the write
    c = c_full[: v.numel()].reshape(v.shape)
    INPLACE[write](v, c)
    return (b * b).sum() + (v * 3).sum() + other.sum()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(12, generator=g, dtype=torch.float64), torch.randn(12, generator=g, dtype=torch.float64)


def _torch_run(view, write):
    a0, c0 = _inputs()
    a, c = a0.clone().requires_grad_(), c0.clone().requires_grad_()
    out = _program(torch, view, write, a, c)
    out.backward()
    return out.detach().numpy(), a.grad.numpy(), c.grad.numpy() if c.grad is not None else None


def _flow_run(view, write):
    a0, c0 = _inputs()
    a = flow.tensor(a0.numpy(), requires_grad=True)
    c = flow.tensor(c0.numpy(), requires_grad=True)
    out = _program(flow, view, write, a, c)
    out.backward()
    return out.detach().numpy(), a.grad.numpy(), c.grad.numpy() if c.grad is not None else None


MULTI_OUTPUT = {"split", "chunk", "unbind"}   # torch forbids in-place writes on these with autograd


@pytest.mark.parametrize("write", sorted(INPLACE))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_eager_values_and_grads_match_torch(view, write):
    if view in MULTI_OUTPUT:
        with pytest.raises(RuntimeError):
            _torch_run(view, write)
        with pytest.raises(RuntimeError, match="several views"):
            _flow_run(view, write)
        return
    want = _torch_run(view, write)
    got = _flow_run(view, write)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-10, atol=1e-12)
    if want[2] is None:
        assert got[2] is None or not np.any(got[2])
    else:
        np.testing.assert_allclose(got[2], want[2], rtol=1e-10, atol=1e-12)


def _inference_program(lib, view, write, a, c_full):
    b = a * 1
    v = VIEWS[view](b)
    other = b[:3]
    c = c_full[: v.numel()].reshape(v.shape)
    INPLACE[write](v, c)
    return b * 1, other * 1, v * 1


@pytest.mark.parametrize("write", sorted(INPLACE))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_graph_values_match_torch(view, write):
    a0, c0 = _inputs()
    want = _inference_program(torch, view, write, a0.clone(), c0.clone())

    class G(flow.nn.Graph):
        def build(self, a, c):
            return _inference_program(flow, view, write, a, c)
    got = G()(flow.tensor(a0.numpy()), flow.tensor(c0.numpy()))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("write", ["mul_scalar", "add_tensor", "exp", "setitem", "copy"])
@pytest.mark.parametrize("view", ["slice", "t", "view_of_view", "narrow", "diagonal"])
def test_graph_training_grads_match_torch(view, write):
    """A parameter's gradient through an in-place write on a view, compiled as a train graph."""
    a0, c0 = _inputs()
    ta = torch.nn.Parameter(a0.clone())
    tc = torch.nn.Parameter(c0.clone())
    _program(torch, view, write, ta, tc).backward()

    class M(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = flow.nn.Parameter(flow.tensor(a0.numpy()))
            self.c = flow.nn.Parameter(flow.tensor(c0.numpy()))

        def forward(self):
            return _program(flow, view, write, self.a, self.c)
    m = M()
    opt = flow.optim.SGD(m.parameters(), lr=1.0)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self):
            loss = self.m()
            loss.backward()
            return loss
    G()()
    # SGD with lr=1: the step moved each parameter by exactly minus its gradient
    np.testing.assert_allclose(a0.numpy() - m.a.detach().numpy(), ta.grad.numpy(), rtol=1e-9, atol=1e-12)
    tc_grad = tc.grad.numpy() if tc.grad is not None else np.zeros(12)   # c unused by the write
    np.testing.assert_allclose(c0.numpy() - m.c.detach().numpy(), tc_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("write", [False, True])
def test_graph_keeps_the_layout_of_a_view_written_in_place(write):
    """A transposed view written in place stays transposed, so its ``reshape`` copies (eager's
    does): writing the copy leaves the base alone. The trace gave the written view the
    contiguous layout of the write's result, took the reshape for a view of the base, and the
    graph failed at run time (graph fuzzer seed 14915)."""
    def program(x):
        t = x.permute(1, 0)
        if write:
            t[..., 0:3] = 0.5
        r = t.reshape(-1)
        r[1:23] = -1.5
        return r * 1, x * 1

    class G(flow.nn.Graph):
        def build(self, x):
            return program(x)
    got = G()(flow.arange(32.0).view(4, 8))
    want = program(torch.arange(32.0).view(4, 8))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_issue_examples():
    a = flow.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    b = a * 1
    b[1:].mul_(2)
    b.sum().backward()
    assert a.grad.tolist() == [1.0, 2.0, 2.0, 2.0]

    a = flow.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    c = flow.tensor([1.0, 1.0], requires_grad=True)
    b = a * 1
    b[1:3].add_(c * 5)
    b.sum().backward()
    assert c.grad.tolist() == [5.0, 5.0]


def test_inference_graph_example_from_the_issue():
    class G(flow.nn.Graph):
        def build(self, a):
            b = a * 1
            b[1:].mul_(2)
            b[0] = 100.0
            return b
    assert G()(flow.ones(4)).tolist() == [100.0, 2.0, 2.0, 2.0]


def test_errors_where_torch_errors():
    leaf = flow.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="view of a leaf"):
        leaf[1:].mul_(2)
    with pytest.raises(RuntimeError, match="leaf tensor"):
        leaf.mul_(2)
    t_leaf = torch.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError):
        t_leaf[1:].mul_(2)
    # a detach_()ed base is a leaf: its view that still has history is refused a write, in both
    for lib in (torch, flow):
        x = lib.ones(3, 4, requires_grad=True) * 2
        v = x[1:]
        x.detach_()
        with pytest.raises(RuntimeError, match="view of a leaf"):
            v.mul_(2)
    # a number written into a region of an expanded tensor that still shares elements, in both
    # (views fuzzer, 32 steps, seed 2900)
    for lib in (torch, flow):
        e = lib.ones(3, 4).unsqueeze(0).expand(2, 3, 4).permute(1, 0, 2)
        with pytest.raises(RuntimeError, match="single memory location"):
            e[0:3:2] = -1.5
    # exp saves its output: writing into it afterwards breaks exp's backward, in both
    for lib in (torch, flow):
        x = lib.ones(4, requires_grad=True)
        y = x.exp()
        y[1:].mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation|modified by an in-place"):
            y.sum().backward()


def test_no_grad_write_through_a_view_changes_the_base_only():
    a = flow.ones(4, requires_grad=True)
    b = a * 1
    with flow.no_grad():
        b[1:].mul_(3)
    assert b.tolist() == [1.0, 3.0, 3.0, 3.0]
    b.sum().backward()
    assert a.grad.tolist() == [1.0, 1.0, 1.0, 1.0]   # torch: the no_grad write is not recorded


@pytest.mark.parametrize("write", [False, True], ids=["unwritten", "no_grad_write"])
def test_detaching_a_base_in_place_after_its_views_were_taken(write):
    """A view taken before its base's detach_() keeps sending gradient to the base's history,
    unless the storage was written since (here under no_grad): then the view's history is
    re-derived from the detached base and its gradient goes nowhere, as torch's (whose view
    regenerates its grad_fn lazily: reading it between the write and the detach_ would keep it;
    tests/test_fuzz_views_inplace.py accepts either of torch's answers there)."""
    got = []
    for lib in (torch, flow):
        d = lib.tensor(np.arange(12.0).reshape(4, 3), requires_grad=True)
        x = d.clone()
        v = x[:, 2]
        if write:
            with lib.no_grad():
                v.mul_(0.5)
        x.detach_()
        (v * lib.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
        got.append((v.requires_grad, None if d.grad is None else d.grad.numpy().tolist()))
    assert got[0] == got[1]
    want = (True, None) if write else (True, [[0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4]])
    assert got[1] == want


def test_a_write_through_a_view_taken_before_its_base_required_grad():
    """``v = b.reshape(-1)`` while ``b`` needs no grad; ``b.add_(a)`` makes it require grad;
    ``v.masked_fill_(...)`` then overwrites some of ``b``, whose gradient there is zero. torch
    refuses the write ("a leaf Variable ... in-place") unless ``v``'s grad_fn was read after
    ``b.add_`` (its lazily regenerated view history); holoflow too (it took the write either way
    before: tests/test_fuzz_views_inplace.py, seed 94165, and _generate_chains seed 401498)."""
    got = []
    for lib, read in ((torch, False), (torch, True), (flow, False), (flow, True)):
        a = lib.tensor(np.linspace(-1, 1, 12).reshape(3, 4), requires_grad=True)
        b = lib.tensor(np.linspace(-0.3, 0.3, 12).reshape(3, 4))
        v = b.reshape(-1)
        b.add_(a)
        if read:
            assert v.grad_fn is not None
        try:
            v.masked_fill_(v > 0, 0.5)
        except RuntimeError as e:
            got.append(str(e))
            continue
        (b * 2).sum().backward()
        got.append(a.grad.numpy().tolist())
    assert "leaf Variable that requires grad is being used in an in-place operation" in got[0]
    assert "leaf tensor that requires grad is being used in an in-place operation" in got[2]
    kept = ((np.linspace(-1, 1, 12) + np.linspace(-0.3, 0.3, 12)).reshape(3, 4) <= 0) * 2.0
    assert got[1] == got[3] == kept.tolist()


@pytest.mark.parametrize("write", ["copy_", "mul_", "fill_", "masked_fill_"])
def test_a_write_into_an_empty_view_of_an_expanded_tensor_is_taken(write):
    """An empty view shares no element, so torch takes the write (nothing changes) where it
    refuses one into the expanded tensor itself (views fuzz, seed 111162)."""
    got = []
    for lib in (torch, flow):
        a = lib.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
        x = (a * 2).unsqueeze(0).expand(2, 3, 4)
        e = x.narrow(2, 2, 0)
        {"copy_": lambda: e.copy_(a[0, 0]), "mul_": lambda: e.mul_(2), "fill_": lambda: e.fill_(1.0),
         "masked_fill_": lambda: e.masked_fill_(e > 0, 0.5)}[write]()
        (x * lib.tensor(np.arange(24.0).reshape(2, 3, 4))).sum().backward()
        got.append((tuple(e.shape), a.grad.numpy().tolist()))
        with pytest.raises(RuntimeError, match="single memory location"):
            x.mul_(2)   # (the expanded tensor itself is still refused)
    assert got[0] == got[1]


@pytest.mark.filterwarnings("ignore:Use of index_put_ on expanded tensors is deprecated")
@pytest.mark.parametrize("read", ["view", "base", "base_after_write"])
def test_gradients_through_an_expanded_view_written_by_index(read):
    """``v = b.unsqueeze(0).expand(2, 3, 4); v[[0, 1]] = a`` writes ``a`` into ``b``'s memory
    through both (aliased) rows. Read through ``v`` afterwards, torch's gradient of ``a`` is that
    of the view re-derived from ``b``'s new history (its rows both read ``b``'s gradient, then the
    write's backward sums them); holoflow used to read ``v``'s own write node instead and gave
    half of it (views fuzz, seed 140134)."""
    values = np.random.default_rng(0).standard_normal((3, 4))
    got = []
    for lib in (torch, flow):
        a = lib.tensor(values, requires_grad=True)
        b = lib.zeros(3, 4, dtype=lib.float64)
        v = b.unsqueeze(0).expand(2, 3, 4)
        v[lib.tensor([0, 1])] = a
        w = lib.tensor(np.arange(24.0).reshape(2, 3, 4))
        if read == "base_after_write":
            b.mul_(0.5)
        loss = (b * w[0]).sum() if read == "base" else (v * w).sum()
        loss.backward()
        got.append(a.grad.numpy().tolist())
    assert got[0] == got[1]


def test_write_into_a_base_that_needs_no_grad_makes_it_require_grad():
    for lib in (torch, flow):
        c = lib.tensor([2.0, 3.0], requires_grad=True)
        b = lib.zeros(4)
        b[1:3].mul_(c)
        assert b.requires_grad
        (b * lib.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
        assert c.grad.tolist() == [0.0, 0.0]
    c = flow.tensor([2.0, 3.0], requires_grad=True)
    b = flow.ones(4)
    b[1:3].mul_(c)
    (b * flow.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert c.grad.tolist() == [2.0, 3.0]


@pytest.mark.parametrize("how", ["add_", "mul_", "copy_", "setitem", "addcmul_", "out_of_place"])
def test_a_view_whose_base_requires_grad_since_carries_it_into_an_in_place_write(how):
    """A view taken while its base needed no grad follows the base once the base is written with a
    value that requires grad: written into another tensor in place, it carries the gradient (the
    in-place path missed it: no history, no gradient; views x in-place fuzz seed 12887)."""
    def run(lib):
        c = lib.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
        w = lib.tensor([5.0, 6.0], requires_grad=True)
        d = c.detach()
        v = d[1:3]
        d[0:2] = w * 2
        y = lib.ones(2)
        if how == "add_":
            y.add_(v)
        elif how == "mul_":
            y.mul_(v)
        elif how == "copy_":
            y.copy_(v)
        elif how == "setitem":
            y[0:2] = v
        elif how == "addcmul_":
            y.addcmul_(v, v)
        else:
            y = y + v
        assert y.requires_grad and y.grad_fn is not None
        (y * lib.tensor([1.0, 3.0])).sum().backward()
        return w.grad.tolist(), y.detach().tolist()
    assert run(flow) == run(torch)


def test_a_multi_output_view_whose_base_was_written_is_refused_in_an_in_place_write():
    """As above with a piece of ``split``: torch refuses to use it once its base was written
    (fuzz seed 12887's last step); so does holoflow, where it used the stale piece silently."""
    for lib in (torch, flow):
        d = lib.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True).detach()
        piece = d.split([2, 2])[1]
        d[0:2] = lib.tensor([5.0, 6.0], requires_grad=True) * 2
        with pytest.raises(RuntimeError, match="multiple views|several"):
            lib.zeros(2).add_(piece)


def test_concurrent_backward_on_a_shared_leaf_loses_nothing():
    import threading
    w = flow.ones(256, requires_grad=True)
    n_threads, n_iter = 4, 25

    def work():
        for _ in range(n_iter):
            (w * 2).sum().backward()
    for _ in range(3):
        w.grad = None
        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert w.grad.tolist() == [2.0 * n_threads * n_iter] * 256


def _torch_and_flow(program):
    """``program(lib)`` run with torch and with holoflow: both raise, or equal results."""
    out = []
    for lib in (torch, flow):
        try:
            out.append(("ok", program(lib)))
        except Exception as e:   # noqa: BLE001 - compared below
            out.append(("raised", type(e).__name__))
    return out


def _setitem_after_iadd(lib):          # Python runs x[i] += v as getitem, iadd, setitem
    a = lib.ones(3, 4, requires_grad=True)
    x = a * 2
    x[..., 0] += 1
    x[:, 1] += x[:, 2]
    (x * x).sum().backward()
    return x.tolist(), a.grad.tolist()


def _stale_view_backward(lib):        # the base written in place after the view was taken
    a = lib.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    b = lib.tensor([2.0, 3.0, 4.0, 5.0], requires_grad=True)
    z = a * 1
    r = z.view(2, 2)
    z.mul_(b)
    r.backward(lib.ones(2, 2))
    return a.grad.tolist(), b.grad.tolist()


def _stale_view_autograd_grad(lib):
    a = lib.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    b = lib.tensor([2.0, 3.0, 4.0, 5.0], requires_grad=True)
    z = a * 1
    r = z[1:3]
    z.mul_(b)
    return [g.tolist() for g in lib.autograd.grad([r], [a, b], [lib.ones(2)])]


def _written_through_a_sibling_view(lib):
    a = lib.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    z = a * 1
    r, t = z.view(2, 2), z.view(4)
    t.add_(a)
    t.mul_(3)
    r.backward(lib.ones(2, 2))
    return a.grad.tolist()


# a base detach_()ed after its views were taken: as torch, a view keeps its history until the
# storage is written (torch regenerates a view's grad_fn when its version counter moves, from its
# base's: none); then it still requires grad, and no gradient goes past it

def _view_of_a_detached_base(lib):
    a = lib.ones(3, 4, requires_grad=True)
    x = a * 2
    v = x.t()
    x.detach_()
    (v * lib.arange(12.0).view(4, 3)).sum().backward()
    return v.requires_grad, a.grad.tolist()


def _view_of_a_detached_base_written(lib):
    a = lib.ones(3, 4, requires_grad=True)
    x = a * 2
    v = x.t()
    x.detach_()
    x[1] = -0.5
    ((v * 3).sum() + a.sum()).backward()
    return v.requires_grad, v.select(0, 1).requires_grad, a.grad.tolist()


def _view_used_then_its_detached_base_written(lib):
    a = lib.ones(3, 4, requires_grad=True)
    x = a * 2
    v = x[1:]
    x.detach_()
    y = v * 3                  # (the history it still has)
    x.clamp_(min=0.5)
    ((v * 5).sum() + y.sum()).backward()
    return a.grad.tolist()


def _view_written_before_its_base_detached(lib):   # the write predates detach_(), the view unused since
    a = lib.ones(3, 4, requires_grad=True)
    x = a * 2
    v = x[1:]
    x.mul_(a)
    x.detach_()
    ((v * 3).sum() + a.sum()).backward()
    return v.requires_grad, a.grad.tolist()


def _sibling_of_a_detached_base_written_under_no_grad(lib):
    a = lib.ones(3, 4, requires_grad=True)
    x = a * 2
    v, w = x[0], x[1:]
    x.detach_()
    with lib.no_grad():
        w.mul_(3)
    ((v * 3).sum() + (w * 2).sum() + a.sum()).backward()
    return a.grad.tolist()


@pytest.mark.parametrize("program", [_setitem_after_iadd, _stale_view_backward, _stale_view_autograd_grad,
                                     _written_through_a_sibling_view, _view_of_a_detached_base,
                                     _view_of_a_detached_base_written, _view_used_then_its_detached_base_written,
                                     _view_written_before_its_base_detached,
                                     _sibling_of_a_detached_base_written_under_no_grad],
                         ids=lambda f: f.__name__.strip("_"))
def test_in_place_write_then_backward_equals_torch(program):
    want, got = _torch_and_flow(program)
    assert want[0] == "ok" and got == want


@pytest.mark.parametrize("read", [False, True])
@pytest.mark.parametrize("index", ["slice", "int", "tensor"])
def test_a_view_written_by_setitem_follows_its_base_detached_later(read, index):
    """``v = base.reshape(-1); v[3:] = 0.5; base.detach_()``: torch writes the temporary view
    ``v[3:]``, so ``v``'s grad_fn regenerates at its next use, from the detached base, and no
    gradient reaches ``a`` (unless ``v.grad_fn`` was read before the detach). holoflow assigned
    into ``v`` and re-derived it at once: a wrong gradient of ``a``, silently (global fuzz seed
    75758). Advanced indexing (``v[t] = ...``) is torch's ``index_put_`` on ``v`` itself."""
    a_np = np.random.default_rng(0).standard_normal((4, 6))

    def program(lib, a):
        base = (a * 1.0).var(1, keepdim=True)
        v = base.reshape(-1)
        key = {"slice": slice(3, None), "int": 3, "tensor": lib.tensor([1, 3])}[index]
        v[key] = 0.5
        if read:
            v.grad_fn  # noqa: B018 - torch's getter regenerates the view's history here
        base.detach_()
        (v * lib.arange(4.0, dtype=lib.float64)).sum().backward()
        return a.grad

    want = program(torch, torch.tensor(a_np, requires_grad=True))
    got = program(flow, flow.tensor(a_np, requires_grad=True))
    assert (got is None) == (want is None)
    if want is not None:
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-12)


# torch's view requires grad whenever its base does (``requires_grad`` reads the base's flag and
# re-derives nothing); one with no history of its own (made under no_grad, or taken before its
# leaf base's requires_grad_()) sends no gradient anywhere, and one made under no_grad is refused
# once its storage was written since (fuzz: _generate_chains, seeds 1 and 3 and the ones below)

def _requires_grad_read_before_the_base_is_detached(lib):   # (silent: a gradient torch never sends)
    a = lib.ones(3, 4, requires_grad=True)
    t4 = a * 2
    t5 = t4.reshape(-1)
    v = t5[2:]
    v[1:] = 0.5               # (writes the temporary view v[1:]: t5 and v re-derive at their next use)
    t5.requires_grad          # noqa: B018 - a read with no effect in torch
    t4.detach_()
    (t5 * 3).sum().backward()
    return a.grad


def _no_grad_view_used_with_grad_on(lib):
    a = lib.ones(3, requires_grad=True)
    with lib.no_grad():
        v = a[1:]
    y = v * 2
    y.sum().backward()
    return v.requires_grad, v.is_leaf, y.requires_grad, a.grad


def _no_grad_view_written_under_no_grad_then_used(lib):
    a = lib.ones(3, requires_grad=True)
    with lib.no_grad():
        v = a[1:]
        a.mul_(2)
    return (v * 2).requires_grad


def _no_grad_view_written_under_no_grad_then_read(lib):
    a = lib.ones(3, requires_grad=True)
    with lib.no_grad():
        v = a[1:]
        a.mul_(2)
    return v.grad_fn is None


def _base_requires_grad_after_its_view_was_taken(lib):
    b = lib.ones(3)
    v = b[1:]
    b.requires_grad_()
    (v * 2).sum().backward()
    return v.requires_grad, v.is_leaf, b.grad


def _base_written_then_requires_grad(lib):   # the view's history re-derived: the gradient reaches b
    b = lib.ones(3)
    v = b[1:]
    b.mul_(2)
    b.requires_grad_()
    (v * 2).sum().backward()
    return v.requires_grad, v.is_leaf, b.grad


def _base_requires_grad_then_written_under_no_grad(lib):
    b = lib.ones(3)
    v = b[1:]
    v.grad_fn                 # noqa: B018 - (torch's getter looks at nothing here)
    b.requires_grad_()
    with lib.no_grad():
        b.mul_(2)
    (v * 2).sum().backward()
    return b.grad


# a view made under no_grad has no history of its base's and torch never re-derives one: it is
# refused once its storage was written since, if it requires grad (fuzz: _generate_chains, seeds
# 400646, 400936, 400986)

def _no_grad_view_of_a_stale_view(lib):    # (the stale view's derivation is not the new view's)
    d = lib.tensor([[1.0, 2, 3], [4, 5, 6]], requires_grad=True)
    y = (d * 1).t()
    y[2] = -0.5               # (y is stale: re-derived at its next use)
    with lib.no_grad():
        z = y.unsqueeze(1)
    (z * 2).sum().backward()
    return d.grad


def _no_grad_view_written_under_no_grad_used_with_another_input(lib):
    d = lib.ones(4, 3, requires_grad=True)
    c = lib.ones(4, requires_grad=True)
    with lib.no_grad():
        v = d.t()
        v[0] = 0.5
    return (v[1] * c).requires_grad


def _view_of_a_no_grad_view_used_after_its_detached_base_was_written(lib):
    x = lib.ones(3, 3, requires_grad=True) * 2
    with lib.no_grad():
        s = x.select(1, 1)
    e = s.unsqueeze(0)        # (recorded: s requires grad through x, with no history)
    x.detach_()
    x.zero_()
    return tuple(e.unsqueeze(2).shape)


# torch's in-place check asks whether the written view is a leaf by its history as stored: a view
# that requires grad through its base, written in place since the view was taken, has none until
# its next use or read, so a write into it is refused (_generate_chains seed 401498). x[idx] = v
# writes the temporary view x[idx]: x is left as it was (holoflow wrote x itself before)

def _setitem_into_a_view_then_a_write_into_it(lib):
    b = lib.zeros(3, 4)
    c = lib.ones(4, requires_grad=True)
    x = b.reshape(-1)
    x[2:6] = c                # (b requires grad now; x has no history yet)
    x.mul_(2)
    (b * lib.arange(12.0).reshape(3, 4)).sum().backward()
    return c.grad


def _setitem_into_a_view_read_then_a_write_into_it(lib):
    b = lib.zeros(3, 4)
    c = lib.ones(4, requires_grad=True)
    x = b.reshape(-1)
    x[2:6] = c
    x.grad_fn                 # noqa: B018 - re-derives x's history: the write is taken
    x.mul_(2)
    (b * lib.arange(12.0).reshape(3, 4)).sum().backward()
    return c.grad


def _setitem_of_whole_slices_into_a_view_then_a_write_into_it(lib):
    b = lib.zeros(3, 4)
    c = lib.ones(4, requires_grad=True)
    x = b.reshape(3, 4)
    x[0:5, ...] = c           # (whole slices: torch writes x itself, which has a history then)
    x.mul_(2)
    (b * lib.arange(12.0).reshape(3, 4)).sum().backward()
    return c.grad


def _constant_copied_into_a_view_whose_base_was_written(lib):
    b = lib.zeros(3, 4)
    x = b.reshape(-1)
    b[0] = lib.ones(4, requires_grad=True)
    x.copy_(lib.ones(12))
    return x.sum().item()


def _no_grad_write_into_a_view_then_its_base_detached(lib):   # (_generate_chains seed 412935)
    b = lib.zeros(3, 4)
    v = b.diagonal()
    b.requires_grad_()
    with lib.no_grad():
        v.copy_(v)            # (holoflow's write read v.grad_fn, which re-derived it: a history)
    b.detach_()
    return v.requires_grad, v.is_leaf


def _base_detached_then_requiring_grad_again(lib):   # (silent; _generate_chains seed 415650)
    d = lib.ones(4, 3, requires_grad=True)
    x = (d * 2).cumsum(1)
    v = x.unsqueeze(2)
    x.detach_()
    x.requires_grad_()        # (no write: v keeps the history it had, to d, not one to x)
    (v * 3).sum().backward()
    return d.grad, x.grad


def _retain_grad_and_hook_on_a_no_grad_view(lib):   # (it requires grad: both are taken)
    a = lib.ones(3, requires_grad=True)
    with lib.no_grad():
        v = a[1:]
    v.retain_grad()
    v.register_hook(lambda g: g * 2)
    (v * 2).sum().backward()
    return v.grad, a.grad


def _retain_grad_of_a_no_grad_view_whose_base_was_written(lib):   # (_generate_chains seed 400811)
    a = lib.ones(3, requires_grad=True)
    with lib.no_grad():
        v = a[1:]
        a.mul_(2)
    v.retain_grad()           # (a leaf, as torch asks: nothing re-derived, nothing refused yet)
    return v.requires_grad


def _view_added_to_itself_after_its_base_required_grad(lib):   # (_generate_chains seed 420726)
    b = lib.zeros(3, 4)
    x = b.t()
    b.add_(lib.ones(4, requires_grad=True))   # (x has no history yet: a leaf, as torch asks)
    x.add_(x)                 # (holoflow re-derived x as the source before checking x)
    return x.sum().item()


def _retain_grad_under_no_grad_of_a_written_no_grad_view(lib):   # (_generate_chains seed 421488)
    a = lib.ones(3, 4, requires_grad=True)
    with lib.no_grad():
        v = a.squeeze()
    w = v.view(-1)            # (recorded: w has a history, and is a view made from a no_grad one)
    try:
        with lib.no_grad():
            a.mul_(2)
            w.retain_grad()   # (torch's getter refuses it in any grad mode)
    except RuntimeError as e:
        return "no_grad mode" in str(e)


def _retained_view_cut_from_its_detached_base(lib):   # (_generate_chains seed 432567)
    a = lib.ones(3, 4, requires_grad=True)
    v = a.view(-1)
    v.retain_grad()
    with lib.no_grad():
        a[0] = 0.5
    a.detach_()               # (v's history re-derived at its use: none past it, still retained)
    (v * lib.arange(12.0)).sum().backward()
    return v.grad


def _no_grad_view_retained_twice_around_a_write(lib):   # (_generate_chains seed 432621)
    d = lib.ones(4, 3, requires_grad=True)
    with lib.no_grad():
        v = d.unfold(0, 2, 1)
    w = v[1:]                 # (recorded: a history, and a view taken from a no_grad one)
    w.retain_grad()
    with lib.no_grad():
        d.mul_(2)
    w.retain_grad()           # (retained already: torch looks at nothing, refuses nothing)
    return w.requires_grad


def _piece_of_a_written_base_read_under_no_grad(lib):   # (_generate_chains seed 452734)
    c = lib.ones(4, requires_grad=True)
    p = c.unbind(0)[1]
    with lib.no_grad():
        c.add_(c)
        return p.is_leaf      # (torch's getter refuses it in any grad mode)


def _plain_result(r):
    if isinstance(r, tuple):
        return tuple(_plain_result(x) for x in r)
    return r.tolist() if hasattr(r, "tolist") else r


@pytest.mark.parametrize("program", [_requires_grad_read_before_the_base_is_detached,
                                     _no_grad_view_used_with_grad_on,
                                     _no_grad_view_written_under_no_grad_then_used,
                                     _no_grad_view_written_under_no_grad_then_read,
                                     _base_requires_grad_after_its_view_was_taken,
                                     _base_written_then_requires_grad,
                                     _base_requires_grad_then_written_under_no_grad,
                                     _no_grad_view_of_a_stale_view,
                                     _no_grad_view_written_under_no_grad_used_with_another_input,
                                     _view_of_a_no_grad_view_used_after_its_detached_base_was_written,
                                     _setitem_into_a_view_then_a_write_into_it,
                                     _setitem_into_a_view_read_then_a_write_into_it,
                                     _setitem_of_whole_slices_into_a_view_then_a_write_into_it,
                                     _constant_copied_into_a_view_whose_base_was_written,
                                     _no_grad_write_into_a_view_then_its_base_detached,
                                     _base_detached_then_requiring_grad_again,
                                     _retain_grad_and_hook_on_a_no_grad_view,
                                     _retain_grad_of_a_no_grad_view_whose_base_was_written,
                                     _view_added_to_itself_after_its_base_required_grad,
                                     _retain_grad_under_no_grad_of_a_written_no_grad_view,
                                     _retained_view_cut_from_its_detached_base,
                                     _no_grad_view_retained_twice_around_a_write,
                                     _piece_of_a_written_base_read_under_no_grad],
                         ids=lambda f: f.__name__.strip("_"))
def test_views_follow_their_base_as_torch_does(program):
    want, got = (_plain_result(r) if r[0] == "ok" else r for r in _torch_and_flow(program))
    assert got == want


@pytest.mark.parametrize("write", ["clamp_", "mul_", "relu_"])
def test_a_write_into_overlapping_windows_counts_each_element_once(write):
    """``u = x.unfold(-1, 2, 1)`` holds the middle elements twice; ``u.clamp_(min=0.5)`` writes
    them (the same value twice: an op that is not idempotent writes what torch's kernel reads
    back in memory order, which holoflow doesn't copy). torch's CopySlices writes the gradient of the view's old value
    back into the base once per element; holoflow sent it through the view's history, which sums
    the windows: twice the gradient there, silently (_generate_chains seed 400263)."""
    rng = np.random.default_rng(0)
    d_np, w5, wu = rng.standard_normal((4, 3)), rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 2, 2, 2))
    grads = []
    for lib in (torch, flow):
        d = lib.tensor(d_np, requires_grad=True)
        x = (d * 1.0).reshape(2, 2, 3)
        u = x.unfold(2, 2, 1)
        {"clamp_": lambda: u.clamp_(min=0.5), "mul_": lambda: u.mul_(1.0), "relu_": lambda: u.relu_()}[write]()
        ((x * lib.tensor(w5)).sum() + (u * lib.tensor(wu)).sum()).backward()
        grads.append(d.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-10, atol=1e-12)


def test_a_view_copied_into_itself_after_its_base_required_grad_is_refused():
    """``x = b.view(-1); x[2:5] = c`` (b requires grad now, x has no history yet: a leaf, as
    torch's in-place check asks it); ``x.copy_(x)``: torch refuses it, as ``x.add_(x)``.
    holoflow's copy_ expanded its source first, which re-derived x, and took the write
    (_generate_chains seed 431569)."""
    def program(lib):
        b = lib.zeros(3, 4)
        x = b.view(-1)
        x[2:5] = lib.ones(3, requires_grad=True)
        x.copy_(x)
    for lib in (torch, flow):
        with pytest.raises(RuntimeError, match="leaf"):
            program(lib)


def test_a_view_written_with_itself_reads_itself_through_its_hooks():
    """``v.register_hook(h); v.add_(v)``: the written v's old value reaches its base past v's
    node (torch's CopySlices), but v as the other operand is read through it, hook included.
    holoflow re-derived v before reading it as the operand: the hook was skipped, silently
    (_generate_chains seed 460040)."""
    a_np = np.random.default_rng(1).standard_normal((3, 4))
    grads = []
    for lib in (torch, flow):
        a = lib.tensor(a_np, requires_grad=True)
        s = a.unfold(1, 2, 1).sum(2, keepdim=True)
        v = s.select(0, 2)
        v.register_hook(lambda g: g * 2)
        v.add_(v)
        (s * lib.tensor(np.arange(9.0).reshape(3, 3, 1))).sum().backward()
        grads.append(a.grad.numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


_OVERLAPPING_WRITES = {
    "mul_": lambda u, t: u.mul_(2.0),
    "add_ tensor": lambda u, t: u.add_(t),
    "exp_": lambda u, t: u.exp_(),
    "sigmoid_": lambda u, t: u.sigmoid_(),
    "addcmul_": lambda u, t: u.addcmul_(t, t, value=0.5),
    "div_ tensor": lambda u, t: u.div_(t.abs() + 1),
    "pow_": lambda u, t: u.pow_(2),
    "mul_ tensor": lambda u, t: u.mul_(t),
    "lerp_": lambda u, t: u.lerp_(t, 0.3),   # (a composite: computed out of place, copied in)
}


@pytest.mark.parametrize("requires_grad", ["base", "operand", "none"])
@pytest.mark.parametrize("write", sorted(_OVERLAPPING_WRITES))
def test_a_write_into_overlapping_windows_leaves_torchs_values(write, requires_grad):
    """``x.unfold(2, 2, 1).mul_(2)``: torch's kernel writes the windows element after element,
    each write seen by the next window holding the element, so an element held twice is doubled
    twice. holoflow computed the op out of place and copied it in (doubled once) whenever autograd
    recorded, silently; the values are now those torch's in-place kernel leaves, and the gradients
    torch's (once per element, as its CopySlices writes them)."""
    rng = np.random.default_rng(0)
    d_np, t_np, w_np = rng.uniform(0.2, 0.9, (4, 3)), rng.uniform(0.2, 0.9, (2, 2, 2, 2)), rng.standard_normal((2, 2, 2, 2))
    results = []
    for lib in (torch, flow):
        d = lib.tensor(d_np, requires_grad=requires_grad == "base")
        t = lib.tensor(t_np, requires_grad=requires_grad == "operand")
        x = (d * 1.0).reshape(2, 2, 3)
        u = x.unfold(2, 2, 1)
        _OVERLAPPING_WRITES[write](u, t)
        loss = (x * 1.5).sum() + (u * lib.tensor(w_np)).sum()
        if loss.requires_grad:
            loss.backward()
        results.append([x.detach().numpy().copy()] + [g.grad.numpy() for g in (d, t) if g.grad is not None])
    assert len(results[0]) == len(results[1])   # (the same tensors got gradients)
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("write", ["cumsum_", "cumprod_", "hypot_", "i0_", "ldexp_", "copysign_", "tril_", "addmm_",
                                   "put_"])
def test_writes_without_an_in_place_kernel_into_overlapping_windows_leave_torchs_values(write):
    """These ops had no in-place kernel: holoflow computed them out of place and copied the
    result into the view even without autograd, so an element held by two windows took one
    window's value (cumsum_ along the windows, hypot_ ...), silently. Each declares torch's
    in-place kernel now (apply_inplace refuses, clearly, an op that declares none there)."""
    rng = np.random.default_rng(1)
    x_np, t_np = rng.uniform(0.2, 0.9, (2, 5)), rng.uniform(0.2, 0.9, (2, 4, 2))
    calls = {"cumsum_": lambda u, t: u.cumsum_(2), "cumprod_": lambda u, t: u.cumprod_(1),
             "hypot_": lambda u, t: u.hypot_(t), "i0_": lambda u, t: u.i0_(), "ldexp_": lambda u, t: u.ldexp_(t),
             "copysign_": lambda u, t: u.copysign_(t - 0.5), "tril_": lambda u, t: u[0].tril_(),
             "addmm_": lambda u, t: u[1].addmm_(t[0], t[1][:2]),
             "put_": lambda u, t: u.put_((t[0, :, 0] * 10).long(), t[1, :, 1])}
    values = []
    for lib in (torch, flow):
        x = lib.tensor(x_np)
        calls[write](x.unfold(1, 2, 1), lib.tensor(t_np))
        values.append(x.numpy())
    np.testing.assert_allclose(values[1], values[0], rtol=1e-12)


@pytest.mark.parametrize("write", ["zero_", "mul_", "fill_"])
def test_a_write_into_empty_windows_of_a_recorded_view_does_nothing_as_torchs(write):
    # views fuzzer seed 901373: unfold of an empty slice of a tensor requiring grad, written in
    # place: holoflow took it for overlapping windows and sized their memory from (size - 1)
    # strides, negative for an empty dim (RuntimeError 'Storage size calculation overflowed')
    def run(lib):
        w = lib.ones(4, 3, 4, dtype=lib.float64, requires_grad=True)
        b = w * 1.0
        u = b[2:2:2].unfold(2, 2, 1)
        {"zero_": lambda: u.zero_(), "mul_": lambda: u.mul_(2.0), "fill_": lambda: u.fill_(3.0)}[write]()
        (b * b).sum().backward()
        return u.shape, w.grad.numpy()
    (gs, gg), (ts, tg) = run(flow), run(torch)
    assert tuple(gs) == tuple(ts)
    np.testing.assert_array_equal(gg, tg)
