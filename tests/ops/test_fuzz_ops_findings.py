"""The op fuzzer's findings (tests/ops/test_fuzz_ops.py), minimized: each against torch, forward,
backward and exception class; cheaper than keeping their seeds."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import holoflow as flow
from harness import raised


def _t(x):
    return x.to_torch() if isinstance(x, flow.Tensor) else x


def _same(got, want) -> None:
    got = _t(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-6, atol=1e-6)


def _same_error(fn) -> BaseException:
    """``fn(torch)`` raises; ``fn(holoflow)`` raises an exception of its class."""
    want = raised(lambda: fn(torch))
    assert want is not None, "torch did not raise"
    got = raised(lambda: fn(flow))
    assert isinstance(got, type(want)), f"torch raised {want!r}; holoflow {got!r}"
    return got


@pytest.mark.parametrize("name", ["sum", "nansum", "prod", "cumsum", "cumprod"])
def test_an_integer_dtype_of_a_tensor_requiring_grad_is_refused(name):
    """seed 221: ``cumsum(x, dim, dtype=int64)`` of an x requiring grad computed (an integer
    result, no history: silently no gradient); torch refuses (autograd records it, and an integer
    result can't carry a gradient). Under no_grad, or for a float dtype, it computes."""
    args = (0,) if name.startswith("cum") else ()

    def run(lib, dtype="int64"):
        x = lib.tensor([1.5, 2.0, -3.0], requires_grad=True)
        return getattr(lib, name)(x * 1, *args, dtype=getattr(lib, dtype))
    got = _same_error(run)
    assert name in str(got)
    with torch.no_grad():
        want = run(torch)
    with flow.no_grad():
        got = run(flow)
    _same(got, want)
    want, got = run(torch, "float64"), run(flow, "float64")
    _same(got.detach(), want.detach())


def test_norm_with_p_0_has_no_gradient():
    """``norm(x, p=0)`` (the count of non-zeros): torch's rule gives no gradient (None); holoflow's
    gave zeros, so ``autograd.grad(..., allow_unused=True)`` was zeros where torch's is None."""
    def run(lib):
        x = lib.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 3.0]], requires_grad=True)
        y = lib.norm(x * 1, p=0) + lib.norm(x * 2, p=0, dim=1).sum()
        (g,) = lib.autograd.grad(y, x, allow_unused=True)
        x2 = lib.tensor([1.0, -2.0], requires_grad=True)
        (lib.norm(x2, p=0) + x2.sum()).backward()
        return g, x2.grad
    want, got = run(torch), run(flow)
    assert want[0] is None and got[0] is None
    _same(got[1], want[1])


_COMPLEX_REFUSED = {
    "nan_to_num": lambda lib, z: lib.nan_to_num(z),
    "silu": lambda lib, z: lib.nn.functional.silu(z),
    "embedding": lambda lib, z: lib.nn.functional.embedding(lib.tensor([1, 0]), z),
    "scatter_reduce": lambda lib, z: z.scatter_reduce(0, lib.tensor([[0, 1]]), z[:1], "sum"),
    "index_reduce": lambda lib, z: z.index_reduce(0, lib.tensor([0]), z[:1], "prod"),
    "bilinear": lambda lib, z: lib.nn.functional.bilinear(z, z, z.reshape(1, 2, 2).repeat(1, 1, 1)),
    "normal": lambda lib, z: lib.normal(z, 1.0),
    "geqrf": lambda lib, z: lib.geqrf(z)[0],
}


@pytest.mark.parametrize("name", sorted(_COMPLEX_REFUSED))
def test_complex_results_without_a_complex_derivative_refuse_autograd(name):
    """torch refuses (RuntimeError, at the call) to record these ops on complex tensors: their
    derivatives are for real tensors; holoflow computed, with gradients of its own. Under
    no_grad (and in place: ``nan_to_num_``, ``silu(inplace=True)``) both compute."""
    def run(lib):
        z = lib.tensor([[1 + 2j, -1.5 + 0.5j], [0.3 - 1j, 2 + 0j]], dtype=lib.complex64, requires_grad=True)
        return _COMPLEX_REFUSED[name](lib, z * 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _same_error(run)
        assert type(got) is RuntimeError and name in str(got)
        with flow.no_grad():
            assert run(flow).dtype == flow.complex64
    if name in ("nan_to_num", "silu"):
        _in_place_records(name)


def _in_place_records(name: str) -> None:
    def run(lib):
        z = lib.tensor([1 + 2j, float("nan") + 0.5j], dtype=lib.complex64, requires_grad=True)
        y = lib.nn.functional.silu(z * 1, inplace=True) if name == "silu" else (z * 1).nan_to_num_()
        y.real.sum().backward()
        return y.detach(), z.grad
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8"])
def test_l1_loss_mean_of_integers_is_refused(dtype):
    """``l1_loss(int, int)`` (mean) computed a float mean; torch's mean of the integer loss
    refuses (RuntimeError). Its 'sum' and 'none' compute, in the integer dtype."""
    def run(lib, reduction="mean"):
        a = lib.tensor([1, 5, 2], dtype=getattr(lib, dtype))
        return lib.nn.functional.l1_loss(a, lib.tensor([0, 1, 4], dtype=getattr(lib, dtype)), reduction=reduction)
    assert "l1_loss" in str(_same_error(run))
    for reduction in ("sum", "none"):
        _same(run(flow, reduction), run(torch, reduction))


def test_floor_divide_takes_out_with_an_operand_requiring_grad():
    """``floor_divide(x, 2, out=o)`` with x requiring grad: torch takes it (floor_divide has no
    derivative: out requires grad, its backward raises); holoflow refused, as for the
    differentiable functions (``add(x, 2, out=o)``: both refuse, before the out's dtype)."""
    for shape in ((0,), (3,)):
        res = []
        for lib in (torch, flow):
            x = lib.full(shape, 3.5, requires_grad=True)
            o = lib.zeros(7)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = lib.floor_divide(x, 2.0, out=o)
            res.append((r is o, o.requires_grad, o.detach()))
        assert res[0][:2] == res[1][:2]
        _same(res[1][2], res[0][2])

    def refused(lib):
        return lib.add(lib.ones(2, requires_grad=True), 2.0, out=lib.zeros(2, dtype=lib.int64))
    _same_error(refused)


def test_a_factory_into_out_with_requires_grad_makes_out_a_leaf_requiring_grad():
    for lib in (torch, flow):
        o = lib.zeros(2)
        assert lib.ones(2, out=o, requires_grad=True) is o
        assert o.requires_grad and o.is_leaf and o.tolist() == [1.0, 1.0]


def test_reductions_of_empty_tensors_into_out_of_another_dtype():
    """``nansum(empty float32, out=uint8)``: torch computes (0: its kernel is not run on an empty
    input); holoflow asked torch on a one-element stand-in, which refuses (NotImplementedError)."""
    def run(lib):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = lib.nansum(lib.ones(0), out=lib.zeros((), dtype=lib.uint8))
            b = lib.nansum(lib.ones(2, 0), 1, out=lib.zeros(7, dtype=lib.int64))
            c = lib.cumsum(lib.ones(0, dtype=lib.int32), 0, out=lib.zeros(0, dtype=lib.bool))
        return a, b, c
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize("name", ["all", "any"])
def test_all_and_any_into_a_uint8_out_reduce_the_input_cast_to_uint8(name):
    """``all(x, out=uint8)``: torch's kernel reduces x cast to uint8 (0.5 -> 0, 2j -> 0), so
    ``all([0.5, 1.0])`` is 0 there; holoflow wrote the boolean reduction (1), silently."""
    def run(lib):
        f = getattr(lib, name)
        outs = []
        for x in (lib.tensor([0.5, 1.0]), lib.tensor([1 + 1j, 2j]), lib.tensor([256, 1]), lib.tensor([0.3j, 0])):
            o, o2, o3 = lib.zeros((), dtype=lib.uint8), lib.zeros(1, dtype=lib.uint8), lib.zeros((1, 1), dtype=lib.bool)
            f(x, out=o)
            f(x.reshape(1, 2), 1, out=o2)
            f(x.reshape(1, 2), 1, keepdim=True, out=o3)
            outs += [o, o2, o3]
        return outs
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)


def test_erfinv_written_into_overlapping_windows_differentiates_as_torch():
    """``u.erfinv_()`` of overlapping ``unfold`` windows: torch's rule reads erfinv of the input
    (the windows as they were), holoflow's read the output, which there holds the values the
    kernel left (an element written twice): its gradient differed, silently."""
    def run(lib):
        a = lib.tensor([0.3, 0.5, 0.7, 0.2], dtype=lib.float64, requires_grad=True)
        b = a * 1
        b.unfold(0, 2, 1).erfinv_()
        (g,) = lib.autograd.grad((b * (lib.arange(4, dtype=lib.float64) + 1)).sum(), a)
        return b.detach(), g
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)
    x = flow.tensor([0.1, -0.6], dtype=flow.float64, requires_grad=True)   # (and everywhere else)
    (g,) = flow.autograd.grad(x.erfinv().sum(), x)
    assert torch.allclose(g.to_torch(), 0.5 * math.sqrt(math.pi) * torch.erfinv(x.to_torch().detach()).pow(2).exp())


def test_in_place_logical_ops_record_zero_gradients():
    """A decision, not torch's: torch's ``x.logical_and_(t)`` bypasses autograd (x keeps its old
    history, so the gradient of its old values flows through the 0/1 values written, and with
    only t requiring grad x doesn't require grad). The result is a step function of x and t:
    holoflow records it with zero gradients, as torch records the in-place comparisons
    (``x.lt_(t)``) of a float x; t gets no gradient (as in torch)."""
    for name in ("logical_and_", "logical_or_", "logical_xor_"):
        a = flow.tensor([1.0, 0.0, 3.0], requires_grad=True)
        t = flow.tensor([2.0, 0.0, 0.0], requires_grad=True)
        x = a * 1
        y = getattr(x, name)(t)
        want = getattr(torch.tensor([1.0, 0.0, 3.0]), name)(torch.tensor([2.0, 0.0, 0.0]))
        assert y is x and y.requires_grad and torch.equal(y.detach().to_torch(), want)
        ga, gt = flow.autograd.grad((y * flow.tensor([1.0, 2.0, 3.0])).sum(), (a, t), allow_unused=True)
        assert ga.tolist() == [0.0, 0.0, 0.0] and gt is None   # (torch's t: None too)


# torch's formulas read the result the in-place kernel leaves in overlapping windows (an element
# written twice: its last write): pow_/float_power_(tensor)'s exponent gradient, hypot_'s and ldexp_'s
# (holoflow's rules recomputed it, or ran torch's vjp out of place); mvlgamma_ is one op in torch
# (holoflow's composite's copy_ summed the windows' gradients)
_WINDOWS = {
    "pow_": lambda lib, u, t: u.pow_(t),
    "float_power_": lambda lib, u, t: u.float_power_(t),
    "hypot_": lambda lib, u, t: u.hypot_(t),
    "ldexp_": lambda lib, u, t: u.ldexp_(t),
    "mvlgamma_": lambda lib, u, t: u.mvlgamma_(1),
    "copysign_": lambda lib, u, t: u.copysign_(t - 1.7),
}


@pytest.mark.parametrize("name", sorted(_WINDOWS))
def test_gradients_through_overlapping_windows_written_in_place(name):
    def run(lib):
        a = lib.tensor([0.3, 0.5, 0.7, 0.2], dtype=lib.float64, requires_grad=True)
        t = lib.tensor([1.5, 2.0], dtype=lib.float64, requires_grad=True)
        b = a * 1
        _WINDOWS[name](lib, b.unfold(0, 2, 1), t)
        g = lib.autograd.grad((b * (lib.arange(4, dtype=lib.float64) + 1)).sum(), (a, t), allow_unused=True)
        return [b.detach()] + [x for x in g if x is not None]
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)


@pytest.mark.xfail(strict=True, reason="torch's gradient of sgn of a real tensor is a ZeroTensor (structurally zero: "
                   "an infinite factor upstream keeps it 0, not NaN); holoflow's autograd has no structural zeros "
                   "(None would lose torch's zeros at the leaves), so the factor's rule gives 0 * inf = NaN")
def test_sgn_of_a_real_tensor_has_a_structurally_zero_gradient():
    """seed 200779: ``var(x, 0, correction=1).sgn_()`` of a one-element bfloat16 x (var's rule
    with no degree of freedom multiplies by inf): torch's gradient is 0, holoflow's NaN. As here
    with ``(b * inf).sgn()``; also seeds 220864 (rsqrt of 0), 228159 (pow of a False base), 237008."""
    def run(lib):
        b = lib.tensor([0.7, -2.0], requires_grad=True)
        return lib.autograd.grad((b * math.inf).sgn().sum(), b)[0]
    _same(run(flow), run(torch))


@pytest.mark.parametrize("name", ["expand", "reshape", "view", "repeat"])
def test_a_shape_left_out_is_refused(name):
    """seeds 205217, 206829, 207968 (expand), 210356 (reshape), 213871, 213998 (view):
    ``x.reshape()`` (no shape) was the 0-d reshape (silently: ``tensor([1.]).reshape()`` a 0-d
    tensor), ``x.expand()`` x itself; torch's TypeError (a 0-d target is ``reshape(())``)."""
    _same_error(lambda lib: getattr(lib.tensor([1.0]) if name != "expand" else lib.tensor(1.0), name)())
    _same(getattr(flow.tensor(1.0), name)(()), getattr(torch.tensor(1.0), name)(()))
    _same(flow.kron(flow.tensor(2.0), flow.tensor(3.0)), torch.kron(torch.tensor(2.0), torch.tensor(3.0)))


@pytest.mark.parametrize("name", ["amax", "amin", "cummax", "cummin", "mode", "softmax", "log_softmax"])
def test_empty_complex_results_refuse_autograd(name):
    """seeds 208113 (amin), 214816 (softmax): of an empty complex tensor requiring grad the kernel
    runs (it refuses complex values only when there are some), and torch then refuses to record
    the complex result (RuntimeError); holoflow computed. Non-empty: the kernel's refusal
    (NotImplementedError) first, in both."""
    for shape, cls in (((2, 0), RuntimeError), ((2, 2), NotImplementedError)):
        got = _same_error(lambda lib: getattr(lib, name)(lib.zeros(shape, dtype=lib.complex64, requires_grad=True), 0))
        assert type(got) is cls or cls is NotImplementedError and isinstance(got, cls)


@pytest.mark.parametrize("name", ["fmod", "remainder"])
def test_fmod_saves_its_operands_only_for_the_divisor_gradient(name):
    """seed 214037: ``fmod(x, y)`` with only x requiring grad, then ``y`` written in place: torch's
    backward runs (the dividend's gradient reads nothing); holoflow had saved y and refused."""
    def run(lib):
        x = lib.tensor([1.5, -2.5], requires_grad=True)
        y = lib.tensor([1.0, 2.0])
        z = getattr(lib, name)(x, y)
        y.mul_(2)
        z.sum().backward()
        return x.grad
    _same(run(flow), run(torch))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_of_probabilities_over_no_class_with_label_smoothing(reduction):
    """seed 205114: the backward of ``cross_entropy`` of an (N, 0) input with a probability target
    and label smoothing divided by the class count (ZeroDivisionError); torch's gradient is empty."""
    def run(lib):
        x = lib.zeros(2, 0, dtype=lib.bfloat16, requires_grad=True)
        y = lib.nn.functional.cross_entropy(x, lib.zeros(2, 0, dtype=lib.bfloat16), reduction=reduction,
                                            label_smoothing=0.1)
        return y.detach(), lib.autograd.grad(y.sum(), x)[0]
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)


def test_cross_entropy_checks_the_batch_size_before_the_target_dtype():
    """seed 207679: ``cross_entropy((3, 4), int32 target of shape (4,))``: torch's first check is
    the batch sizes (ValueError); holoflow's was the target's dtype (a TypeError)."""
    got = _same_error(lambda lib: lib.nn.functional.cross_entropy(lib.zeros(3, 4), lib.zeros(4, dtype=lib.int32)))
    assert isinstance(got, ValueError) and "batch_size" in str(got)


def test_logsumexp_into_a_wider_out_sums_in_its_dtype():
    """seeds 209352, 210510: ``logsumexp(half, dim, out=float32 or complex64)``: torch sums the
    exponentials in out's dtype (its sum_out), holoflow rounded the result to half first (a
    silent 1e-3 difference); and float32 into a half out adds the maxima before rounding."""
    def run(lib):
        x = lib.tensor([[0.3, 1.7, -0.2], [0.9, 0.1, 1.1]])
        outs = []
        for xd, od, dims, keep in (("float16", "float32", (1, 0), False), ("bfloat16", "complex64", (1,), True),
                                   ("float32", "float16", (0,), False), ("int64", "float64", (1,), False)):
            o = lib.zeros((), dtype=getattr(lib, od))
            lib.logsumexp((x * 3).to(getattr(lib, xd)), dims, keepdim=keep, out=o)
            outs.append(o)
        return outs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for g, w in zip(run(flow), run(torch)):
            _same(g, w)


def test_cumsum_gradient_is_cast_to_the_input_dtype_before_the_sum():
    """seeds 214036, 206878: ``cumsum(x, dtype=float16)`` of a float32 x: torch casts the
    gradient to float32, then sums it in reverse; holoflow summed in float16 first (silently off
    by half's rounding)."""
    def run(lib):
        x = lib.tensor([[0.1, 1.3, 2.7, 3.3] * 4], requires_grad=True)
        y = lib.cumsum(x * 1, 1, dtype=lib.float16)
        (y.double() * (lib.arange(16, dtype=lib.float64) / 7 + 0.013)).sum().backward()
        return x.grad
    _same(run(flow), run(torch))


def test_atan2_gradient_in_torch_order():
    """seed 206026: atan2's half-precision gradient was ``dy * (b / den)``; torch's is
    ``dy * b * (1 / den)`` (one ulp apart, silently); 0 at the origin (-0 for the second)."""
    def run(lib):
        a = lib.tensor([0.8, 0.8, 0.8, 0.8, 0.0], dtype=lib.float16, requires_grad=True)
        b = lib.tensor([0.5, -1.2, 2.3, 0.7, 0.0], dtype=lib.float16, requires_grad=True)
        w = lib.tensor([0.3, -1.1, 0.7, 2.0, 1.0], dtype=lib.float16)
        return lib.autograd.grad((lib.atan2(a, b) * w).sum(), (a, b))
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)
        assert torch.equal(g.to_torch().signbit(), w.signbit())


def test_in_place_pow_exponent_gradient_in_the_targets_dtype():
    """seed 210898: ``z.pow_(t)``, z complex64 and t float64: torch's exponent gradient reads the
    complex64 result (its in-place output); holoflow's rule recomputed ``a ** b`` out of place
    (complex128): 5e-8 apart (complex64's rounding), silently."""
    def run(lib):
        z = lib.tensor([0.3 + 1.1j, -0.7 + 0.2j, 1.5 - 0.4j], dtype=lib.complex64, requires_grad=True)
        t = lib.tensor([1.3, -0.6, 2.2], dtype=lib.float64, requires_grad=True)
        y = z * 1
        y.pow_(t)
        return lib.autograd.grad((y.real + 0.5 * y.imag).double().sum(), t)[0]
    assert torch.equal(run(flow).to_torch(), run(torch))


def test_clamp_with_a_bound_requiring_grad_beside_a_number_is_refused():
    """seed 217615: ``clamp(x, t, 0.5)`` with a 0-d t requiring grad: torch's parser takes a tensor
    beside a number as a number, which one requiring grad can't be (TypeError); holoflow computed."""
    def run(lib, bound):
        return lib.clamp(lib.tensor([1.0, 2.0, 3.0]), bound, 0.5)
    _same_error(lambda lib: run(lib, lib.tensor(1.5, requires_grad=True) * 1))
    _same(run(flow, flow.tensor(1.5)), run(torch, torch.tensor(1.5)))


_SAVING = {"pow_": lambda lib, x, t: (x * 1).pow_(t), "copysign": lambda lib, x, t: lib.copysign(x, t),
           "hypot": lambda lib, x, t: lib.hypot(x, t), "ldexp": lambda lib, x, t: lib.ldexp(x, t)}


@pytest.mark.parametrize("name", sorted(_SAVING))
def test_binary_ops_save_what_torch_saves_per_gradient_wanted(name):
    """seed 219312: ``copysign(x, t)`` with only t requiring grad, then ``x.exp_()``: torch's
    backward runs (t's gradient is zeros, reading nothing; the node keeps only the result);
    holoflow's had saved both inputs and refused. Each op, each set of inputs requiring grad and
    each tensor written in place after: the same refusals, and as many tensors packed by
    saved-tensor hooks, as torch. (``x.pow_(t)``'s node saves the result, which its exponent's
    gradient reads; holoflow's out-of-place ``x ** t`` recomputes it, so a result written since
    is not refused there, where torch's is.)"""
    def run(lib, needs, written):
        x = lib.tensor([0.3, -0.5, 2.0], requires_grad=needs[0]) * 1
        t = lib.tensor([1.5, 0.0, -1.0], requires_grad=needs[1]) * 1
        packed = []
        with lib.autograd.graph.saved_tensors_hooks(lambda v: (packed.append(1), v)[1], lambda v: v):
            y = _SAVING[name](lib, x, t)
        z = y * 1
        if written is not None:
            {"x": x, "t": t, "y": y}[written].mul_(2)
        err = raised(lambda: z.sum().backward())
        return len(packed), type(err)
    for needs in ((True, False), (False, True), (True, True)):
        for written in (None, "x", "t", "y"):
            assert run(flow, needs, written) == run(torch, needs, written), (needs, written)


def test_mvlgamma_is_torchs_kernel_and_derivative():
    """``mvlgamma`` was a composite of lgammas: an ulp off torch's kernel (float32 3.3, p=3),
    silently, and it computed on complex tensors torch refuses (NotImplementedError)."""
    def run(lib, p):
        x = lib.tensor([3.3, 4.1, 2.7, 9.25], requires_grad=True)
        y = lib.mvlgamma(x, p)
        return y.detach(), lib.autograd.grad((y * lib.tensor([0.3, -1.1, 2.0, 0.7])).sum(), x)[0]
    for p in (1, 2, 3, 4):
        for g, w in zip(run(flow, p), run(torch, p)):
            assert torch.equal(g.to_torch(), w), p
    _same_error(lambda lib: lib.mvlgamma(lib.tensor([3 + 1j]), 2))


@pytest.mark.parametrize("name", ["add", "sub"])
def test_complex_alpha_gradient_is_conjugated(name):
    """seed 217040: ``add(a, b, alpha=1+2j)``: torch's gradient of b is ``dy * conj(alpha)``,
    holoflow's was ``dy * alpha`` (silently). A bool alpha of a non-bool result: torch's
    RuntimeError (holoflow took True as 1)."""
    def run(lib):
        a = lib.tensor([0.5 + 0.2j, -1 + 1j], requires_grad=True)
        b = lib.tensor([1.5 - 0.2j, 0.4 + 1j], requires_grad=True)
        y = getattr(lib, name)(a, b, alpha=1 + 2j)
        return lib.autograd.grad((y * lib.tensor([1 + 1j, 2 - 1j])).real.sum(), (a, b))
    for g, w in zip(run(flow), run(torch)):
        _same(g, w)
    _same_error(lambda lib: getattr(lib, name)(lib.tensor([1.0]), lib.tensor([2.0]), alpha=True))


def test_rounding_division_gradient_is_zeros_not_dy_times_0():
    """seed 219668: ``div(x, d, rounding_mode="trunc")``'s gradients are zeros in torch (new zeros);
    holoflow's were ``dy * 0``: NaN where dy is infinite (log1p, rsqrt downstream), silently."""
    def run(lib, mode):
        x = lib.tensor([0.5, 2.0, -3.0], requires_grad=True)
        d = lib.tensor(1.5, requires_grad=True)
        y = lib.div(x * 1, d, rounding_mode=mode).clamp(0, 0).log1p().rsqrt()
        return lib.autograd.grad(y.sum(), (x, d))
    for mode in ("trunc", "floor"):
        for g, w in zip(run(flow, mode), run(torch, mode)):
            _same(g, w)


@pytest.mark.parametrize("fn", ["cross_entropy", "nll_loss"])
def test_class_index_targets_of_uint8_as_torch(fn):
    """torch's kernels take Long or Byte class indices; holoflow refused uint8 (a TypeError) and
    int32/int8/bool with a TypeError where torch's is a RuntimeError. A spatial input takes Long
    only, and cross_entropy's weighted, smoothed mean refuses Byte (its composite's gather)."""
    def run(lib, dtype, shape=(5, 4), **kw):
        x = lib.tensor([[0.3, -1.2, 0.8, 2.0], [1.1, 0.4, -0.5, 0.0], [0.9, 0.9, 0.1, -2.0],
                        [0.2, 0.3, 0.4, 0.5], [-1.0, 1.0, 0.5, 0.25]], dtype=lib.float64).reshape(shape)
        x.requires_grad_(True)
        t = lib.tensor([2, 0, 3, 1, 2], dtype=getattr(lib, dtype)).reshape(shape[:1] + shape[2:])
        y = getattr(lib.nn.functional, fn)(x, t, **kw)
        return y.detach(), lib.autograd.grad(y.sum(), x)[0]
    w = {"weight": [0.5, 1.0, 2.0, 0.25]}
    for kw in ({}, {"reduction": "none", "ignore_index": 3}, {"reduction": "sum"}, w):
        kw = {k: torch.tensor(v, dtype=torch.float64) if k == "weight" else v for k, v in kw.items()}
        fkw = {k: flow.tensor(v) if k == "weight" else v for k, v in kw.items()}
        for g, want in zip(run(flow, "uint8", **fkw), run(torch, "uint8", **kw)):
            _same(g, want)
    for dtype in ("int32", "int8", "bool"):
        _same_error(lambda lib: run(lib, dtype))
    assert "int64" in str(_same_error(lambda lib: run(lib, "uint8", (1, 4, 5))))
    if fn == "cross_entropy":
        _same_error(lambda lib: run(lib, "uint8", label_smoothing=0.2, weight=lib.ones(4, dtype=lib.float64)))


@pytest.mark.parametrize("name", ["hypot_", "ldexp_", "pow_"])
def test_in_place_gradients_read_the_result_in_the_targets_dtype(name):
    """seed 215947: ``y.hypot_(t)``, y and t 0-d, float32 and float64: torch's gradients read the
    float32 result written; holoflow's recomputed it in float64 (ulps off, silently)."""
    def run(lib):
        x = lib.tensor(2.9, requires_grad=True)   # (0-d both: they promote to float64, written as float32)
        t = lib.tensor(1.3, dtype=lib.float64, requires_grad=True)
        y = x * 1.1
        getattr(y, name)(t)
        return lib.autograd.grad(y * 0.7, (x, t))
    for g, w in zip(run(flow), run(torch)):
        assert torch.equal(g.to_torch(), w)


_BOOL_DIMS = {
    "max": lambda lib, x: x.max(True), "sum": lambda lib, x: x.sum(True), "amax": lambda lib, x: x.amax(True),
    "argmax": lambda lib, x: x.argmax(True), "cumsum": lambda lib, x: x.cumsum(False), "squeeze": lambda lib, x: x.squeeze(True),
    "unsqueeze": lambda lib, x: x.unsqueeze(True), "select": lambda lib, x: x.select(True, 0),
    "transpose": lambda lib, x: x.transpose(True, 0), "flip": lambda lib, x: x.flip(True), "cat": lambda lib, x: lib.cat([x, x], True),
    "sort": lambda lib, x: x.sort(True), "gather": lambda lib, x: x.gather(True, lib.tensor([[0]])),
    "all": lambda lib, x: x.all((True,)),
}


@pytest.mark.parametrize("name", sorted(_BOOL_DIMS))
def test_a_bool_dim_is_refused(name):
    """seed 225263: ``x.max(True)``: torch's parser refuses a bool as a dim (TypeError); holoflow
    took it as dim 1 (and so every op reading a dim)."""
    _same_error(lambda lib: _BOOL_DIMS[name](lib, lib.ones(2, 2, dtype=lib.int32)))


@pytest.mark.parametrize("name", ["addmm", "baddbmm", "addmv"])
def test_the_addmm_family_saves_each_operand_for_the_others_gradient(name):
    """seed 224432: ``baddbmm(input, b1, b2)`` saved its input, which no gradient reads: written in
    place after, holoflow's backward refused where torch's runs. Each operand is saved for the
    other's gradient only (as many tensors packed as torch)."""
    shapes = {"addmm": ((2, 3), (2, 4), (4, 3)), "baddbmm": ((2, 2, 3), (2, 2, 4), (2, 4, 3)),
              "addmv": ((2,), (2, 4), (4,))}[name]

    def run(lib, needs, written):
        ts = [lib.ones(s, dtype=lib.float64, requires_grad=n) * 1 for s, n in zip(shapes, needs)]
        packed = []
        with lib.autograd.graph.saved_tensors_hooks(lambda v: (packed.append(1), v)[1], lambda v: v):
            y = getattr(lib, name)(*ts, beta=0.5, alpha=2.0)
        ts[written].mul_(2)
        return len(packed), type(raised(lambda: y.sum().backward()))
    for needs in ((False, True, False), (False, False, True), (True, True, False), (True, False, False)):
        for written in range(3):
            assert run(flow, needs, written) == run(torch, needs, written), (needs, written)


def test_xlogy_of_an_integer_tensor_by_a_number_reads_the_number_as_given():
    """seed 228420: ``xlogy(uint8 x, -1)``: the -1 became a uint8 255 before the log (5.54 where
    torch's NaN), silently; 300 wrapped to 44 likewise."""
    for dtype, v in (("uint8", -1), ("uint8", 300), ("int8", -1.5), ("bool", 2)):
        def run(lib):
            return lib.xlogy(lib.tensor([0, 1, 4, 9]).to(getattr(lib, dtype)), v)
        _same(run(flow), run(torch))


_NUMBER_BESIDE = {
    "true_divide": lambda lib, x, v: lib.true_divide(v, x) if lib is flow else v / x,
    "zeta": lambda lib, x, v: lib.special.zeta(x, v),
    "zeta_first": lambda lib, x, v: lib.special.zeta(v, x),
    "xlog1py": lambda lib, x, v: lib.special.xlog1py(x, v),
    "xlog1py_first": lambda lib, x, v: lib.special.xlog1py(v, x),
    "rsub": lambda lib, x, v: v - x,
}


@pytest.mark.parametrize("name", sorted(_NUMBER_BESIDE))
def test_a_number_beside_an_integer_tensor_keeps_its_value(name):
    """A Python number beside an integer tensor was made a tensor of the tensor's dtype before an
    op computing in floats: ``zeta(uint8 x, -1)``, ``true_divide(-1, uint8 x)`` read 255, and
    ``special.xlog1py(int x, 2.5)`` read 2 (silently); ``300 - uint8 x`` refused where torch's
    wraps. (Found beside seed 228420's xlogy.)"""
    for dtype, v in (("uint8", -1), ("int32", 2.5), ("int8", -1.5), ("uint8", 300)):
        for values in ([0, 1, 4, 9], 4):   # (seed 239658: a 0-d tensor, true_divide(-1, amin(uint8 x)))
            def run(lib):
                return _NUMBER_BESIDE[name](lib, lib.tensor(values).to(getattr(lib, dtype)), v)
            _same(run(flow), run(torch))


def test_prod_of_a_0d_tensor_with_dtype_gives_a_gradient_in_its_dtype():
    """seed 238498: ``x.prod(dtype=float16)`` of a 0-d bfloat16 x: its gradient was float16."""
    def run(lib, shape):
        x = lib.full(shape, 1.5, dtype=lib.bfloat16, requires_grad=True)
        return lib.autograd.grad(x.prod(dtype=lib.float16), x)[0]
    for shape in ((), (3,)):
        _same(run(flow, shape), run(torch, shape))


@pytest.mark.parametrize("dtype", ["int64", "bool", "float32"])
def test_a_0d_target_of_a_batch_is_refused_for_its_batch_size(dtype):
    """seed 248882: ``cross_entropy((3, 4) input, 0-d bool target)``: torch's first check is the
    batch sizes (3 vs 0, ValueError); holoflow's was the target's dtype (or its shape)."""
    for fn in ("cross_entropy", "nll_loss"):
        got = _same_error(lambda lib: getattr(lib.nn.functional, fn)(lib.zeros(3, 4), lib.zeros((), dtype=getattr(lib, dtype))))
        assert isinstance(got, ValueError) and "batch_size" in str(got)


def test_lerp_by_a_number_saves_no_input():
    """seed 259930: ``x.lerp_(x, -1)`` (or ``lerp(a, b, 0.3)`` with a written in place after):
    torch's gradients by a number weight read no input and run; holoflow saved input and end and
    refused the backward."""
    def run(lib, written):
        a0 = lib.tensor([1.0, 2.0], requires_grad=True)
        b0 = lib.tensor([3.0, 5.0], requires_grad=True)
        a, b = a0 * 1, b0 * 1
        y = lib.lerp(a, b, 0.3)
        (a if written == "a" else b).mul_(2)
        return lib.autograd.grad(y.sum(), (a0, b0))
    for written in ("a", "b"):
        for g, w in zip(run(flow, written), run(torch, written)):
            _same(g, w)
    x = flow.tensor([[1.5, 2.0]], requires_grad=True) * 1
    x.lerp_(x, -1)
    x.sum().backward()   # (torch's runs)
