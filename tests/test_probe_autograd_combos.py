"""Eager autograd in combination (views x in-place writes x hooks x grad modes x custom Functions x
double backward), each program run with torch and with holoflow: values, gradients, autograd
flags and error classes must agree. Each case is a silent wrong result or a wrong error found by
probing combinations of ops that are right on their own."""
import numpy as np
import pytest
import torch

import holoflow as flow

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 4)).astype(np.float32)
B = RNG.standard_normal((3, 4)).astype(np.float32)


def T(lib, a, rg=False):
    t = torch.tensor(np.asarray(a)) if lib is torch else flow.tensor(np.asarray(a))
    return t.requires_grad_() if rg else t


def _plain(v):
    if isinstance(v, torch.Tensor):
        return v.detach().resolve_conj().numpy()
    if isinstance(v, flow.Tensor):
        return v.detach().numpy()
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    return v


def _assert_same(got, want, path="result"):
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{path}: {got!r} is not a tensor (torch: {want!r})"
        assert got.dtype == want.dtype and got.shape == want.shape, f"{path}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=path)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r} (torch)"


def _run(program, lib):
    try:
        return "ok", _plain(program(lib))
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        return "error", type(e)


def check(program):
    want, got = _run(program, torch), _run(program, flow)
    assert got[0] == want[0], f"torch: {want}, holoflow: {got}"
    if want[0] == "error":
        assert issubclass(got[1], want[1]), f"torch raised {want[1]}, holoflow {got[1]}"
    else:
        _assert_same(got[1], want[1])


def info(t):
    return t.requires_grad, t.is_leaf, t.grad_fn is None


# -- an overwrite with a value that has no history: the old history gets zeros -----------------

VIEWS = {"slice": lambda b: b[1:], "transpose": lambda b: b.t(), "reshape": lambda b: b.reshape(12),
         "diagonal": lambda b: b.diagonal(), "select": lambda b: b[:, 2]}
OVERWRITES = {"copy_": lambda b, lib: b.copy_(T(lib, np.ones((3, 4), np.float32))),
              "fill_": lambda b, lib: b.fill_(2.0),
              "zero_": lambda b, lib: b.zero_()}


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("write", list(OVERWRITES))
def test_base_overwritten_then_view_used(view, write):
    """(copy_ of a constant into the base cut its history but left the view on it: the view's
    gradient still reached ``a``; fill_ gave None where torch gives zeros)."""
    def program(lib):
        a = T(lib, A, rg=True)
        b = a * 2
        v = VIEWS[view](b)
        OVERWRITES[write](b, lib)
        (v * v).sum().backward()
        return info(b), info(v), v, a.grad
    check(program)


@pytest.mark.parametrize("write", ["fill_", "normal_", "uniform_", "copy_rg", "copy_double"])
def test_overwritten_history_gets_zeros_not_none(write):
    def program(lib):
        a = T(lib, A, rg=True)
        w = T(lib, B, rg=True)
        b = a * 2
        if write == "fill_":
            b.fill_(1.5)
        elif write == "copy_rg":
            b.copy_(w * 3)
        elif write == "copy_double":
            b.copy_(T(lib, B.astype(np.float64), rg=True))
        else:
            getattr(b, write)()
        (b * 0 + w * b).sum().backward()
        return a.grad, info(b)
    check(program)


# -- .data, no_grad views, retain_grad -----------------------------------------------------

def test_writes_through_data_are_not_version_checked():
    def program(lib):
        a = T(lib, A, rg=True)
        y = a.exp()
        y.data.add_(1)          # torch's .data has its own version counter
        c = (a * a).sum()
        a.data.mul_(2)
        y.sum().backward()
        c.backward()
        return a.grad
    check(program)


@pytest.mark.parametrize("case", ["leaf_view", "view_with_rg_value", "base_written_later"])
def test_view_made_under_no_grad_then_written_with_grad_raises(case):
    def program(lib):
        a = T(lib, A, rg=True)
        b = a * 2
        with lib.no_grad():
            v = (a if case == "leaf_view" else b)[0]
        if case == "leaf_view":
            v.mul_(2)
        elif case == "view_with_rg_value":
            v.mul_(T(lib, B[0], rg=True))
        else:
            b.mul_(3)
            (v * v).sum().backward()
        return b
    check(program)


def test_view_and_write_both_under_no_grad_is_fine():
    def program(lib):
        a = T(lib, A, rg=True)
        b = a * 2
        with lib.no_grad():
            b[0].mul_(2)
        (b * b).sum().backward()
        return a.grad
    check(program)


@pytest.mark.parametrize("where", ["whole", "view"])
def test_retain_grad_then_in_place_write_keeps_the_new_value_gradient(where):
    def program(lib):
        a = T(lib, A, rg=True)
        b = a * 2
        b.retain_grad()
        (b if where == "whole" else b[1]).mul_(3)
        (b * b).sum().backward()
        return b.grad, a.grad
    check(program)


def test_retained_grad_does_not_alias_other_gradients():
    """(a retained .grad shared the storage of the gradient flowing on: zeroing it zeroed the
    leaf's .grad)."""
    def program(lib):
        a = T(lib, A, rg=True)
        b = a + 0
        b.retain_grad()
        v = a.view(12)
        v.retain_grad()
        (b.sum() + v.sum()).backward()
        b.grad.zero_()
        v.grad.mul_(5)
        return a.grad
    check(program)


# -- .grad accumulation ----------------------------------------------------------------------

def test_grad_accumulates_in_place_into_the_existing_tensor():
    def program(lib):
        a = T(lib, A, rg=True)
        (a * 2).sum().backward()
        g = a.grad
        (a * 3).sum().backward()
        g2 = a.grad
        (a * a).sum().backward(create_graph=True)   # out of place with create_graph
        return g, g2, a.grad
    check(program)


def test_backward_with_inputs_does_not_alias_the_seed():
    def program(lib):
        a = T(lib, A, rg=True)
        g = T(lib, np.ones((3, 4), np.float32))
        a.backward(g, inputs=[a])
        a.grad.mul_(3)
        a.backward(g, inputs=[a])
        return g, a.grad
    check(program)


# -- autograd.grad runs only what it needs ---------------------------------------------------

def test_autograd_grad_leaves_the_rest_of_the_graph_alone():
    def program(lib):
        a = T(lib, A, rg=True)
        w = T(lib, B, rg=True)
        seen = []
        w.register_hook(lambda g: seen.append("w"))
        b = a * w
        g1, = lib.autograd.grad((b * b).sum(), b)
        g2, = lib.autograd.grad((b * b).sum(), a)   # b's own node was not run nor freed
        return g1, g2, seen, w.grad
    check(program)


# -- hooks -----------------------------------------------------------------------------------

@pytest.mark.parametrize("leaf", [True, False])
@pytest.mark.parametrize("change", ["size", "dtype", "not_a_tensor"])
def test_hook_changing_the_gradient_kind_raises(leaf, change):
    def program(lib):
        a = T(lib, A, rg=True)
        t = a if leaf else a * 1
        t.register_hook({"size": lambda g: g[0], "dtype": lambda g: g.double(),
                         "not_a_tensor": lambda g: 5}[change])
        (t * 1).sum().backward()
        return a.grad
    check(program)


def test_post_accumulate_grad_hook_needs_requires_grad():
    check(lambda lib: T(lib, A).register_post_accumulate_grad_hook(lambda t: None))


# -- a view follows its base -----------------------------------------------------------------

def test_view_taken_before_its_base_required_grad_follows_it():
    """(a view of a tensor that then required grad by an in-place write through another view
    stayed constant: the gradient through it was silently lost)."""
    def program(lib):
        b = T(lib, A)
        w = T(lib, B[0], rg=True)
        v = b[1]
        b[1:].mul_(w)
        u = T(lib, B[2], rg=True)
        (v * u).sum().backward()
        return info(v), info(b), w.grad, u.grad
    check(program)


# -- custom Functions ------------------------------------------------------------------------

def _functions(lib):
    class Ident(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 5

    class Exp(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            y, = ctx.saved_tensors
            return g * y

    class TooMany(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g, g

    class WithInt(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, 5

        @staticmethod
        def backward(ctx, g, _):
            return g * 2

    class Cplx(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * (1 + 2j)

        @staticmethod
        def backward(ctx, g):
            return (g * (1 - 2j)).real

    class Dirty(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 2

    once = (torch.autograd.function if lib is torch else flow.autograd.function).once_differentiable

    class Once(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @once
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return 2 * x * g

    return dict(Ident=Ident, Exp=Exp, TooMany=TooMany, WithInt=WithInt, Cplx=Cplx, Dirty=Dirty, Once=Once)


def _fn_identity_leaf(lib):
    a = T(lib, A, rg=True)
    y = _functions(lib)["Ident"].apply(a)
    y.sum().backward()
    return y is a, info(a), info(y), a.grad


def _fn_backward_twice(lib):
    y = _functions(lib)["Exp"].apply(T(lib, A, rg=True))
    loss = y.sum()
    loss.backward()
    loss.backward()


def _fn_too_many_grads(lib):
    _functions(lib)["TooMany"].apply(T(lib, A, rg=True)).sum().backward()


def _fn_non_tensor_output(lib):
    a = T(lib, A, rg=True)
    y, k = _functions(lib)["WithInt"].apply(a)
    y.sum().backward()
    return a.grad, k


def _fn_complex_output(lib):
    a = T(lib, A, rg=True)
    y = _functions(lib)["Cplx"].apply(a)
    y.abs().sum().backward()
    return info(y), a.grad


def _fn_mark_dirty_view(lib):
    a = T(lib, A, rg=True)
    b = a * 1
    v = b[1:]
    y = _functions(lib)["Dirty"].apply(v)
    (b * b).sum().backward()
    return y is v, info(v), a.grad


def _fn_mark_dirty_leaf(lib):
    _functions(lib)["Dirty"].apply(T(lib, A, rg=True))


def _fn_once_differentiable(lib):
    a = T(lib, A, rg=True)
    y = _functions(lib)["Once"].apply(a * 1)
    g, = lib.autograd.grad((y * y).sum(), a, create_graph=True)
    g.sum().backward()


@pytest.mark.parametrize("program", [_fn_identity_leaf, _fn_backward_twice, _fn_too_many_grads,
                                     _fn_non_tensor_output, _fn_complex_output, _fn_mark_dirty_view,
                                     _fn_mark_dirty_leaf, _fn_once_differentiable],
                         ids=lambda f: f.__name__[4:])
def test_custom_function(program):
    check(program)


@pytest.mark.parametrize("how", ["backward", "func.grad", "func.jacrev", "func.vmap"])
def test_custom_function_with_setup_context(how):
    """torch's second style of Function: ``forward(*args)`` without ctx and a static
    ``setup_context(ctx, inputs, output)`` that saves state and marks outputs. (forward was called
    with ctx as a first argument: TypeError)"""
    def program(lib):
        class ScaledExp(lib.autograd.Function):
            generate_vmap_rule = True   # (torch's vmap refuses a Function without it)

            @staticmethod
            def forward(x, scale):
                return x.exp() * scale, x > 0

            @staticmethod
            def setup_context(ctx, inputs, output):
                x, scale = inputs
                y, positive = output
                ctx.mark_non_differentiable(positive)
                ctx.scale = scale
                ctx.save_for_backward(y)

            @staticmethod
            def backward(ctx, g, _):
                y, = ctx.saved_tensors
                return g * y, None
        a = T(lib, A, rg=how == "backward")
        if how == "func.grad":
            return lib.func.grad(lambda x: ScaledExp.apply(x, 2.0)[0].sin().sum())(a)
        if how == "func.jacrev":
            return lib.func.jacrev(lambda x: ScaledExp.apply(x, 0.5)[0])(a[0])
        if how == "func.vmap":
            return lib.func.vmap(lambda x: ScaledExp.apply(x, 3.0)[0])(a)
        y, positive = ScaledExp.apply(a, 2.0)
        (y * T(lib, B)).sum().backward()
        return y, info(y), positive, info(positive), a.grad
    check(program)


@pytest.mark.parametrize("materialize", [True, False])
@pytest.mark.parametrize("used", [0, 3])
def test_custom_function_backward_gets_torchs_unused_output_gradients(materialize, used):
    """What ``backward`` gets for the outputs nothing used: zeros of the output's dtype (an
    integer output marked non-differentiable too), None for a non-tensor output, and None for all
    of them after ``ctx.set_materialize_grads(False)``. (set_materialize_grads was ignored: zeros
    came; a non-tensor output got a float zero.)"""
    def program(lib):
        seen = []

        class SortPlus(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.set_materialize_grads(materialize)
                v, i = x.sort(dim=-1)
                ctx.mark_non_differentiable(i)
                return v, i, 3, x * 2

            @staticmethod
            def backward(ctx, gv, gi, gk, gw):
                seen.extend(None if g is None else (str(g.dtype).split(".")[-1], tuple(g.shape), _plain(g))
                            for g in (gv, gi, gk, gw))
                return (gv if gv is not None else 0) + (2 * gw if gw is not None else 0)
        a = T(lib, A, rg=True)
        outs = SortPlus.apply(a)
        (outs[used] * T(lib, B)).sum().backward()
        return seen, a.grad
    check(program)


# -- complex numbers -------------------------------------------------------------------------

COMPLEX_SCALAR_PROGRAMS = {
    "mul": lambda z: (z * 1j).real, "rmul": lambda z: ((2 - 1j) * z).imag,
    "div": lambda z: (z / (1 + 1j)).real, "rdiv": lambda z: ((1 + 1j) / z).real,
    "rpow": lambda z: ((1 + 2j) ** z).real, "real_mul": lambda z: (z.real * 1j).imag,
    "real_rpow": lambda z: ((1 + 1j) ** z.real).imag,
}


@pytest.mark.parametrize("name", list(COMPLEX_SCALAR_PROGRAMS))
def test_gradient_through_a_python_complex_scalar(name):
    """(the gradient of ``z * c`` was ``dy * c``: torch's is ``dy * conj(c)``; ``c ** x``
    crashed in backward)."""
    def program(lib):
        z = T(lib, np.array([1 + 2j, 3 - 1j, -0.5 + 0.25j], np.complex64), rg=True)
        COMPLEX_SCALAR_PROGRAMS[name](z).sum().backward()
        return z.grad
    check(program)


def test_angle_double_backward():
    """(angle's gradient was computed by a kernel with no gradient: the second derivative
    silently missed its part)."""
    def program(lib):
        a = T(lib, A, rg=True)
        w = T(lib, B, rg=True)
        y = (lib.complex(a, w).angle() ** 2).sum()
        g = lib.autograd.grad(y, [a, w], create_graph=True)
        return g, lib.autograd.grad(sum((x * x).sum() for x in g), [a, w])
    check(program)


@pytest.mark.parametrize("grad", [False, True])
def test_zero_clears_nan_and_inf_as_torch(grad):
    """``zero_()`` writes zeros: NaN and inf become 0 (a multiply by 0 kept them: a gradient that
    overflowed stayed NaN through ``zero_grad(set_to_none=False)``)."""
    def run(lib):
        x = lib.tensor([float("nan"), float("inf"), -float("inf"), 2.0], requires_grad=grad)
        y = x * 1 if grad else x
        y.zero_()
        out = [_plain(y)]
        if grad:
            (y * 3 + x).sum().backward()
            out.append(_plain(x.grad))
        return out
    _assert_same(run(flow), run(torch))


def test_writes_into_an_expanded_view_as_torch():
    """An expanded view shares elements: ``zero_``/``fill_`` and writing a region of distinct
    elements work (with autograd recording), other in-place ops fail as torch's kernels do."""
    def run(lib):
        base = lib.tensor(A[0].astype(np.float64), requires_grad=True) * 1
        e = base.unsqueeze(0).expand(3, 4)
        e.zero_()
        e[1:2] = 5.0
        out = [_plain(base), _plain(e)]
        try:
            e.mul_(2)
            out.append("no error")
        except RuntimeError:
            out.append("RuntimeError")
        return out
    _assert_same(run(flow), run(torch))


@pytest.mark.parametrize("op", ["matmul", "matmul_broadcast", "index"])
def test_an_input_whose_values_no_gradient_reads_may_change_after_use(op):
    """Ops save only what their wanted gradients read, as torch's: ``x @ w`` with only ``w``
    requiring grad keeps ``x``, not ``w``; ``x[idx]`` keeps the indices. Writing the tensor not
    kept in place before backward is then fine (it was an error: a saved tensor modified)."""
    def run(lib):
        x = T(lib, A)                         # needs no grad
        w = T(lib, B.T.copy(), rg=True)       # (4, 3)
        if op == "matmul":
            y = x @ w                         # keeps x (w's gradient reads it), not w
            w_alias = w.detach()
            w_alias.mul_(2)                   # (w itself is a leaf: written through a detached alias)
        elif op == "matmul_broadcast":
            y = lib.stack([x, x]) @ w         # broadcast batch: the einsum gradient
            w.detach().mul_(2)
        else:
            z = w * 1
            y = z[T(lib, np.array([0, 2, 2]))]
            z.detach().mul_(3)                # z's values: no gradient reads them
        y.sum().backward()
        return _plain(w.grad)
    _assert_same(run(flow), run(torch))


@pytest.mark.parametrize("consumer", ["t", "permute_matmul"])
def test_a_write_through_a_reshape_view_reaches_gradients_arriving_transposed(consumer):
    """``t6 = t4.reshape(-1); t6.mul_(3)`` rebases ``t4`` onto a view_scatter; a gradient that
    reaches it transposed (through ``t4.t()``) was cloned with its strides, the reshape of the
    chain then copied instead of viewing, and the write's region lost: ``d`` got 40, not 30."""
    def run(lib):
        d = T(lib, A.astype(np.float64), rg=True)
        t4 = d * 1.0
        t6 = t4.reshape(-1)
        t11 = t4.t()
        t6.mul_(3)
        if consumer == "t":
            (t11 * 10).sum().backward()
        else:
            (t11 @ T(lib, B.astype(np.float64))).sum().backward()
        return _plain(d.grad)
    _assert_same(run(flow), run(torch))
