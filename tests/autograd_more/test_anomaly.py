"""Anomaly mode against torch: the switches, the NaN check and its message, and the warning with
the forward traceback of the op whose backward failed (holoflow's node names are ``<SqrtBackward>``
where torch's are ``SqrtBackward0``; the messages are compared with the names put in place)."""
from __future__ import annotations

import re
import warnings

import pytest
import torch

import holoflow as flow
from holoflow.autograd import anomaly_mode
from holoflow.core import anomaly

LIBS = (torch, flow)
AUTOGRAD = {torch: torch.autograd, flow: flow.autograd}
SWITCHES = {torch: torch, flow: anomaly_mode}


def _norm(msg: str) -> str:
    """A message with the node name and holoflow's prefix in one spelling."""
    msg = re.sub(r"<(\w+)Backward>", r"\1Backward", msg)
    msg = re.sub(r"(\w+)Backward0", r"\1Backward", msg)
    return msg.replace("holoflow.autograd: ", "")


def _nan_function(lib):
    class F(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            return g * float("nan")
    return F


def _raising_function(lib):
    class Boom(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            raise ValueError("boom in backward")
    return Boom


def _caught(lib, program, **kw):
    """(error, warning messages) of running ``program`` under detect_anomaly(**kw)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        err = None
        with AUTOGRAD[lib].detect_anomaly(**kw):
            try:
                program(lib)
            except Exception as e:   # compared below
                err = e
    return err, [str(x.message) for x in w]


def _sqrt_zero(lib):
    b = lib.tensor([0.0, 1.0], requires_grad=True)
    (b.sqrt() * 0).sum().backward()


def _custom_nan(lib):
    _nan_function(lib).apply(lib.ones(3, requires_grad=True)).sum().backward()


def _custom_raise(lib):
    _raising_function(lib).apply(lib.ones(3, requires_grad=True)).sum().backward()


@pytest.mark.parametrize("program", [_sqrt_zero, _custom_nan])
def test_nan_in_backward_raises_and_warns_with_the_forward_traceback(program):
    res = {lib: _caught(lib, program) for lib in LIBS}
    for lib in LIBS:
        err, msgs = res[lib]
        assert type(err) is RuntimeError
        assert msgs[0].startswith("Anomaly Detection has been enabled.")
        assert "Traceback of forward call that caused the error" in msgs[1]
        assert "test_anomaly.py" in msgs[1]   # the user's line, not the framework's
    assert _norm(str(res[flow][0])) == _norm(str(res[torch][0]))
    assert str(res[flow][0]).startswith("holoflow.autograd: Function '<")
    name = re.match(r"Error detected in (\S+)\.", _norm(res[torch][1][1])).group(1)
    assert _norm(res[flow][1][1]).startswith(f"Error detected in {name}. Traceback of forward call")
    forward_line = [ln for ln in res[flow][1][1].splitlines() if "test_anomaly.py" in ln][-1]
    assert forward_line.strip().startswith('File "') and forward_line.rstrip().endswith(f"in {program.__name__}")


def test_check_nan_false_lets_nan_through():
    for lib in LIBS:
        err, msgs = _caught(lib, _sqrt_zero, check_nan=False)
        assert err is None and len(msgs) == 1


def test_an_error_in_backward_warns_with_the_forward_traceback_and_propagates():
    for lib in LIBS:
        err, msgs = _caught(lib, _custom_raise)
        assert type(err) is ValueError and str(err) == "boom in backward"
        assert re.match(r"Error detected in <?BoomBackward>?\. Traceback of forward call that caused the error:",
                        msgs[1])


def test_without_anomaly_mode_nan_passes_and_nothing_is_recorded():
    for lib in LIBS:
        b = lib.tensor([0.0], requires_grad=True)
        y = b.sqrt()
        (y * 0).sum().backward()
        assert torch.isnan(torch.as_tensor(b.grad.numpy())).all()
    assert "traceback_" not in flow.tensor([1.0], requires_grad=True).sqrt().grad_fn.metadata


def test_forward_traceback_kept_in_metadata_only_while_enabled():
    x = flow.ones(2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with flow.autograd.detect_anomaly():
            y = x.exp()
    assert "traceback_" in y.grad_fn.metadata and "traceback_" not in x.exp().grad_fn.metadata


def test_double_backward_error_names_the_node_that_induced_it():
    res = {}
    for lib in LIBS:
        x = lib.tensor([0.0, 4.0], requires_grad=True)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with AUTOGRAD[lib].detect_anomaly():
                g, = lib.autograd.grad(x.sqrt().sum(), x, create_graph=True)   # records a division
                with pytest.raises(RuntimeError) as e:
                    lib.autograd.grad((g * 0).sum(), x)   # whose backward makes 0 * inf
        res[lib] = (_norm(str(e.value)), _norm(str(w[1].message)), _norm(str(w[2].message)))
    assert res[flow][0] == res[torch][0] == "Function 'DivBackward' returned nan values in its 1th output."
    for lib in LIBS:
        assert res[lib][1].startswith("Error detected in DivBackward. Traceback of forward call that caused the error:")
        induced = res[lib][2]   # a warning of its own, as torch's
        assert induced.startswith("\n\nPrevious calculation was induced by SqrtBackward. Traceback of forward call "
                                  "that induced the previous calculation:\n")
        assert "in test_double_backward_error_names_the_node_that_induced_it" in induced


def test_switches_match_torch():
    for lib in LIBS:
        s = SWITCHES[lib]
        a = AUTOGRAD[lib]
        assert s.is_anomaly_enabled() is False and s.is_anomaly_check_nan_enabled() is True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with a.detect_anomaly(check_nan=False):
                assert s.is_anomaly_enabled() is True and s.is_anomaly_check_nan_enabled() is False
                with a.set_detect_anomaly(False):
                    assert s.is_anomaly_enabled() is False and s.is_anomaly_check_nan_enabled() is True
                assert s.is_anomaly_enabled() is True and s.is_anomaly_check_nan_enabled() is False
        assert s.is_anomaly_enabled() is False and s.is_anomaly_check_nan_enabled() is True
        a.set_detect_anomaly(True)   # as a function: on until switched off
        try:
            assert s.is_anomaly_enabled() is True
        finally:
            a.set_detect_anomaly(False)
        assert s.is_anomaly_enabled() is False
        with pytest.raises(TypeError, match="not callable"):   # torch's detect_anomaly is no decorator
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a.detect_anomaly()(lambda: None)
    flow.set_anomaly_enabled(True, False)   # the facade's switch is the engine's
    try:
        assert anomaly.ANOMALY.enabled is True and anomaly.ANOMALY.check_nan is False
        assert flow.is_anomaly_enabled() is True and flow.is_anomaly_check_nan_enabled() is False
    finally:
        flow.set_anomaly_enabled(False)
    assert anomaly.ANOMALY.enabled is False and anomaly.ANOMALY.check_nan is True


def test_switch_is_one_for_the_process_as_torch():
    import threading
    for lib in LIBS:
        SWITCHES[lib].set_anomaly_enabled(True)
        try:
            seen = []
            t = threading.Thread(target=lambda: seen.append(SWITCHES[lib].is_anomaly_enabled()))
            t.start()
            t.join()
            assert seen == [True]
        finally:
            SWITCHES[lib].set_anomaly_enabled(False)
