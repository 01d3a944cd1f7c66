"""gradcheck / gradgradcheck against torch's: the same functions (correct and wrong gradients,
real and complex, slow and fast mode) under both libraries give the same verdict, the same error
class and the same message (after holoflow's prefix), and the same signatures."""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import holoflow as flow
from holoflow.autograd.gradcheck import GradcheckError as FlowGradcheckError
from holoflow.core.errors import UnsupportedError
from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

LIBS = (torch, flow)
ERR = {torch: TorchGradcheckError, flow: FlowGradcheckError}
PREFIX = "holoflow.autograd.gradcheck: "


def _params(f) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


def test_signatures_and_error_class_match_torch():
    assert _params(flow.autograd.gradcheck) == _params(torch.autograd.gradcheck)
    assert _params(flow.autograd.gradgradcheck) == _params(torch.autograd.gradgradcheck)
    assert issubclass(FlowGradcheckError, RuntimeError)
    assert callable(flow.autograd.gradcheck)   # the package's name is the function, as torch's


def _inputs(lib, complex_=False):
    lib.manual_seed(0)
    dt = lib.complex128 if complex_ else lib.float64
    return lib.randn(3, 2, dtype=dt, requires_grad=True), lib.randn(2, 4, dtype=dt, requires_grad=True)


def _wrong(lib, factor=3.0):
    class Wrong(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * a

        @staticmethod
        def backward(ctx, g):
            a, = ctx.saved_tensors
            return factor * a * g
    return Wrong


FUNCS = {
    "matmul_tanh": lambda L: (lambda a, b: (a @ b).tanh()),
    "two_outputs": lambda L: (lambda a, b: ((a @ b).sin(), a.exp().sum())),
    "with_int_output": lambda L: (lambda a, b: (a * 2, a.argmax())),
    "reduction": lambda L: (lambda a, b: (a.sigmoid() @ b).logsumexp(1)),
}


@pytest.mark.parametrize("name", list(FUNCS))
@pytest.mark.parametrize("fast", [False, True])
def test_correct_gradients_pass_in_both(name, fast):
    for lib in LIBS:
        assert lib.autograd.gradcheck(FUNCS[name](lib), _inputs(lib), fast_mode=fast) is True


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("complex_", [False, True])
def test_wrong_gradient_same_verdict_and_message(fast, complex_):
    msgs = {}
    for lib in LIBS:
        x = _inputs(lib, complex_)[0]
        with pytest.raises(ERR[lib]) as e:
            lib.autograd.gradcheck(_wrong(lib).apply, (x,), fast_mode=fast)
        msgs[lib] = str(e.value)
        assert lib.autograd.gradcheck(_wrong(lib).apply, (x,), fast_mode=fast, raise_exception=False) is False
    assert msgs[flow].startswith(PREFIX)
    flow_msg, torch_msg = msgs[flow][len(PREFIX):], msgs[torch]
    if fast:   # the fast-mode numbers, then torch's slow-mode recomputation (compared by its first line)
        head = torch_msg.split("\nThe above quantities")[0]
        assert flow_msg.startswith(head)
    else:
        assert flow_msg == torch_msg


def test_complex_functions():
    for lib in LIBS:
        z = _inputs(lib, complex_=True)[0]
        assert lib.autograd.gradcheck(lambda a: (a * a).exp(), (z,))
        assert lib.autograd.gradcheck(lambda a: (a * a.conj()).real, (z,), fast_mode=True)
        assert lib.autograd.gradgradcheck(lambda a: (a * a).sin(), (z,))


def test_gradgradcheck_same_verdicts():
    for lib in LIBS:
        a, b = _inputs(lib)
        assert lib.autograd.gradgradcheck(lambda x, y: (x @ y).tanh(), (a, b))
        assert lib.autograd.gradgradcheck(lambda x, y: (x @ y).tanh(), (a, b), fast_mode=True)
        # a wrong first derivative that is itself differentiated right passes (it checks the second)
        assert lib.autograd.gradgradcheck(_wrong(lib, 3.0).apply, (a,))
        assert lib.autograd.gradgradcheck(_wrong_second(lib).apply, (a,), raise_exception=False) is False
        assert lib.autograd.gradcheck(_wrong_second(lib).apply, (a,))


def _wrong_second(lib):
    class Inner(lib.autograd.Function):   # 2 a g, with a wrong derivative in a
        @staticmethod
        def forward(ctx, a, g):
            ctx.save_for_backward(a, g)
            return 2 * a * g

        @staticmethod
        def backward(ctx, gg):
            a, g = ctx.saved_tensors
            return 5 * gg * g, 2 * gg * a

    class Square(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * a

        @staticmethod
        def backward(ctx, g):
            a, = ctx.saved_tensors
            return Inner.apply(a, g)
    return Square


def test_input_checks():
    for lib in LIBS:
        x = lib.randn(3, dtype=lib.float64)
        with pytest.raises(ValueError, match="at least one input tensor to require gradient"):
            lib.autograd.gradcheck(lambda a: a * 2, (x,))
        y = lib.randn(1, dtype=lib.float64).expand(3).detach().requires_grad_(True)
        with pytest.raises(RuntimeError, match="stride 0"):
            lib.autograd.gradcheck(lambda a: a * 2, (y,))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            lib.autograd.gradcheck(lambda a: a * 2, (lib.randn(3, requires_grad=True),), raise_exception=False)
        assert any("Input #0 requires gradient and is not a double precision" in str(m.message) for m in w)
        with pytest.raises(AssertionError, match="check_forward_ad or check_backward_ad"):
            lib.autograd.gradcheck(lambda a: a, (x,), check_backward_ad=False)


def test_no_differentiable_outputs():
    for lib in LIBS:
        a = _inputs(lib)[0]
        assert lib.autograd.gradcheck(lambda x: x.detach().sum() * 0 + 1, (a,))
        with pytest.raises(ERR[lib], match="Numerical gradient for function expected to be zero"):
            lib.autograd.gradcheck(lambda x: x.detach() * 2, (a,))


def test_backward_not_multiplied_by_grad_output():
    for lib in LIBS:
        class OnesWhenZero(lib.autograd.Function):   # right for every one-hot grad_output, not for zeros
            @staticmethod
            def forward(ctx, a):
                return a * 1

            @staticmethod
            def backward(ctx, g):
                return g * 1 if bool((g != 0).any()) else lib.ones_like(g)
        a = _inputs(lib)[0]
        with pytest.raises(ERR[lib], match="backward not multiplied by grad_output"):
            lib.autograd.gradcheck(OnesWhenZero.apply, (a,))


def test_nondeterministic_backward_is_not_reentrant():
    for lib in LIBS:
        calls = [0]

        class Noisy(lib.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return a * 1

            @staticmethod
            def backward(ctx, g):
                calls[0] += 1
                return g * (1 + 1e-9 * calls[0])
        a = _inputs(lib)[0]
        with pytest.raises(ERR[lib], match="Backward is not reentrant"):
            lib.autograd.gradcheck(Noisy.apply, (a,))
        assert lib.autograd.gradcheck(Noisy.apply, (a,), nondet_tol=1e-6)


def test_batched_grad_check():
    for lib in LIBS:
        a, b = _inputs(lib)
        assert lib.autograd.gradcheck(lambda x, y: (x @ y).tanh(), (a, b), check_batched_grad=True)


@pytest.mark.parametrize("fast", [False, True])
def test_forward_ad_checks_as_torchs(fast):
    """check_forward_ad checks forward mode (dual tensors) against finite differences: a right
    function passes (alone or with the reverse check, forward over reverse in gradgradcheck), a
    tangent that misses a factor fails with torch's message, in both libraries."""
    for lib in LIBS:
        a, b = _inputs(lib)
        assert lib.autograd.gradcheck(lambda x, y: ((x @ y).tanh(), x.sum(1)), (a, b), check_forward_ad=True,
                                      fast_mode=fast)
        assert lib.autograd.gradcheck(lambda x, y: (x @ y).sin(), (a, b), check_forward_ad=True,
                                      check_backward_ad=False, fast_mode=fast)
        assert lib.autograd.gradgradcheck(lambda x: (x.sin() * x).sum(1), (a,), check_fwd_over_rev=True,
                                          fast_mode=fast)
        with pytest.raises(ERR[lib], match="Jacobian computed with forward mode mismatch for output 0 with "
                                           "respect to input 0"):
            lib.autograd.gradcheck(lambda x: x * x.detach(), (a,), check_forward_ad=True, check_backward_ad=False,
                                   fast_mode=fast)


def test_forward_ad_checks_holoflow_cannot_do_are_refused_not_ignored():
    a = _inputs(flow, complex_=True)[0]
    with pytest.raises(UnsupportedError, match="check_forward_ad=True checks real inputs and outputs"):
        flow.autograd.gradcheck(lambda x: x * 2, (a,), check_forward_ad=True)
    a = _inputs(flow)[0]
    with pytest.raises(UnsupportedError, match="check_batched_forward_grad=True"):
        flow.autograd.gradcheck(lambda x: x * 2, (a,), check_forward_ad=True, check_batched_forward_grad=True)
