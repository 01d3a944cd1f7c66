"""The C build of the eager per-op path (core/_fast.c) against its Python reference
(dispatch._eager_py): same results, same recorded grad nodes, same errors; and the reference
itself still passes the autograd and views suites (``HOLOFLOW_PURE_PYTHON=1``)."""
import os
import subprocess
import sys

import pytest
import torch

import holoflow as flow
from holoflow.core import dispatch
from holoflow.core.registry import REGISTRY
from holoflow.core.tensor import Tensor

FAST = dispatch._FAST
pytestmark = pytest.mark.skipif(os.environ.get("HOLOFLOW_PURE_PYTHON", "") not in ("", "0"),
                                reason="the Python path was asked for")


@pytest.fixture(autouse=True)
def _built(request):
    """Without the extension, one test fails saying so and the others, which compare it with the
    Python path, are skipped with that reason."""
    if FAST is None and request.node.name != "test_the_extension_is_built_and_used":
        pytest.skip("the C extension is not built (see test_the_extension_is_built_and_used)")


def test_the_extension_is_built_and_used():
    # (pip install -e . builds it; the suite runs on it, so a failed build must not pass unseen)
    assert FAST is not None, ("holoflow's C extension (core/_fast.c) was not built: install a C compiler and "
                              "the Python headers and reinstall (pip install -e .), or set HOLOFLOW_PURE_PYTHON=1")
    assert dispatch.apply is FAST.apply and dispatch._eager is FAST.eager
    assert type(Tensor.__mul__).__name__ == "BinaryMethod"


def _fields(t):
    """What a result and its grad node hold, comparable across two runs of one op."""
    n = t.grad_fn
    node = None if n is None else (n.op, len(n.edges), tuple(None if e is None else type(e).__name__ for e in n.edges),
                                   n.attrs, n.shapes, n.dtypes,
                                   None if n._saved is None else tuple(type(s).__name__ for s in n._saved),
                                   None if n._versions is None else tuple(v for _, v in n._versions),
                                   None if n._outs is None else tuple(o is None for o in n._outs), n.out_metas)
    view = t._view
    return (t._data.shape, t._data.dtype, t._rg, t._out_idx, t._global, t._hooks, node,
            None if view is None else (view.chain, view.nograd, view.version, view.at))


def _leaf(*shape, rg=True):
    torch.manual_seed(0)
    return flow.randn(*shape).requires_grad_(rg)


CASES = [
    ("mul", lambda: (_leaf(3, 4), 2.5), {}),                       # a constant input, reads_other
    ("mul", lambda: (_leaf(3, 4), _leaf(4, rg=False)), {}),
    ("matmul", lambda: (_leaf(3, 4), _leaf(4, 2)), {}),
    ("relu", lambda: (_leaf(5),), {}),                               # saves its output
    ("add", lambda: (_leaf(2, 3), _leaf(2, 3)), {"alpha": 2}),       # attrs reach the kernel
    ("permute", lambda: (_leaf(2, 3, 4),), {"dims": (2, 0, 1)}),     # a view op
    ("reshape", lambda: (_leaf(2, 3),), {"shape": (3, 2)}),
    ("layer_norm", lambda: (_leaf(2, 4), _leaf(4), _leaf(4)), {"normalized_shape": (4,), "eps": 1e-5}),
    ("mul", lambda: (_leaf(3, rg=False), 2), {}),                    # nothing to record
    ("cross_entropy_log_softmax", lambda: (_leaf(4, 5), flow.tensor([0, 4, 2, 1])),   # a named tuple,
     {"ignore_index": -100, "reduction": "mean"}),                                   # an int output
    ("split", lambda: (_leaf(6, 2),), {"sizes": [2, 4], "dim": 0}),                       # views, several
    ("permute", lambda: (_leaf(6, 4).view(2, 3, 4),), {"dims": (1, 2, 0)}),          # a view of a view
    ("reshape", lambda: (_leaf(6, 2).split(3)[1],), {"shape": (6,)}),                 # of one of several
    ("mul", lambda: (_leaf(6, 2).t(), _leaf(2, 6)[0]), {}),                           # views as inputs
]


@pytest.mark.parametrize("grad_on", [True, False])
@pytest.mark.parametrize("name,make,attrs", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_c_path_records_what_the_python_path_records(name, make, attrs, grad_on):
    op = REGISTRY[name]
    with flow.set_grad_enabled(grad_on):
        fast = FAST.eager(op, make(), dict(attrs))
        ref = dispatch._eager_py(op, make(), dict(attrs))
    assert type(fast) is type(ref)
    fast, ref = (x if isinstance(x, tuple) else (x,) for x in (fast, ref))
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref):
        assert torch.equal(a._data, b._data)
        assert _fields(a) == _fields(b)


@pytest.mark.parametrize("name,make,attrs", [c for c in CASES if REGISTRY[c[0]].view or c[0] == "mul"],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_under_an_interpreter_that_tracks_no_values_views_are_marked_as_in_eager(name, make, attrs):
    """Autocast is pushed but tracks no values: views are stamped as in eager, so the C path
    keeps them (the Python path's make_view asks the stack for a token, None here)."""
    from holoflow.core import interpret
    op = REGISTRY[name]
    with flow.autocast("cpu"):
        assert interpret._CURRENT.get() is not None and interpret._CURRENT.get().token_source is None
        fast = FAST.eager(op, make(), dict(attrs))
        ref = dispatch._eager_py(op, make(), dict(attrs))
    fast, ref = (x if isinstance(x, tuple) else (x,) for x in (fast, ref))
    for a, b in zip(fast, ref):
        assert torch.equal(a._data, b._data) and _fields(a) == _fields(b)


def test_views_under_autocast_stay_on_the_c_path(monkeypatch):
    """What the C path hands back to Python, counted: views and ops on views under autocast
    (an interpreter that tracks no values) are not among them."""
    handed = []

    def counting(op, inputs, attrs):
        handed.append(op.name)
        return dispatch._eager_py(op, inputs, attrs)

    monkeypatch.setattr(dispatch, "_eager_py", counting)
    dispatch._init_fast()
    try:
        x = _leaf(4, 6)
        with flow.autocast("cpu"):
            y = (x.view(2, 12).t() * 2).reshape(-1)
        y.float().sum().backward()
        assert handed == [] and x.grad is not None
    finally:
        monkeypatch.undo()
        dispatch._init_fast()
    assert dispatch._eager_py is not counting


def test_a_view_of_a_view_and_backward_through_both_paths():
    x = _leaf(2, 3, 4)
    grads = []
    for run in (FAST.eager, dispatch._eager_py):
        x.grad = None
        v = run(REGISTRY["permute"], (x,), {"dims": (2, 0, 1)})
        w = run(REGISTRY["reshape"], (v,), {"shape": (4, 6)})
        assert w._view.base is x and len(w._view.chain) == 2
        (w * flow.arange(24.0).reshape(4, 6)).sum().backward()
        grads.append(x.grad.clone())
    assert torch.equal(grads[0]._data, grads[1]._data)


def test_kernel_errors_come_out_as_the_python_path_raises_them():
    a, b = flow.randn(2, 3), flow.randn(4, 5)
    errs = []
    for run in (FAST.eager, dispatch._eager_py):
        with pytest.raises(RuntimeError) as info:
            run(REGISTRY["matmul"], (a, b), {})
        errs.append(info.value)
    assert str(errs[0]) == str(errs[1]) and "holoflow.matmul" in str(errs[0])
    assert type(errs[0]) is type(errs[1])
    assert isinstance(errs[0].__cause__, RuntimeError) and errs[0].__suppress_context__


def test_apply_copies_its_attrs_and_checks_its_arguments():
    attrs = {"alpha": 2}
    x = flow.ones(3, requires_grad=True)
    y = FAST.apply(REGISTRY["add"], x, x, **attrs)
    assert y.grad_fn.attrs == attrs and y.grad_fn.attrs is not attrs
    assert torch.equal(y._data, torch.full((3,), 3.0))
    with pytest.raises(TypeError, match="no op given"):
        FAST.apply()
    with pytest.raises(TypeError, match="inputs: tuple"):
        FAST.eager(REGISTRY["add"], [x, x], {})


def test_binary_methods_bind_like_functions():
    a, b = flow.tensor([1.0, 2.0]), flow.tensor([3.0, 4.0])
    assert Tensor.__mul__.__name__ == "__mul__"
    assert torch.equal(Tensor.__mul__(a, b)._data, (a * b)._data)   # unbound, as a function
    assert torch.equal(a.__mul__(b)._data, torch.tensor([3.0, 8.0]))
    assert torch.equal((a // 2)._data, torch.tensor([0.0, 1.0]))     # fixed attrs (rounding_mode)
    with pytest.raises(TypeError, match="exactly two"):
        a.__mul__(b, b)


def test_saved_tensor_hooks_and_anomaly_mode_take_the_python_helpers():
    x = _leaf(3)
    packed = []
    with flow.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t):
        y = x * x
    assert packed and type(y.grad_fn).__name__ == "PackedNode"
    y.sum().backward()
    assert torch.allclose(x.grad._data, 2 * x._data)
    with flow.autograd.detect_anomaly(check_nan=False):
        z = x.exp()
    assert z.grad_fn is not None and flow.core.anomaly.METADATA.get(z.grad_fn) is not None


def test_the_python_reference_passes_the_autograd_and_views_suites():
    here = os.path.dirname(__file__)
    env = {**os.environ, "HOLOFLOW_PURE_PYTHON": "1"}
    files = ["test_autograd.py", "test_views_inplace.py", "test_fuzz_views_inplace.py",
             "test_inplace_cuts_history.py", "test_probe_autograd_combos.py",
             os.path.join("autograd_more", "test_hooks_views_inplace.py"),
             os.path.join("autograd_more", "test_hook_order.py"),
             os.path.join("autograd_more", "test_written_view_grad_fn.py"),
             os.path.join("autograd_more", "test_other_view_grad_fn.py")]
    code = ("import holoflow.core.dispatch as d, holoflow.core.native as n, sys; assert d._FAST is None and n.FAST is None; import pytest; "
            f"sys.exit(pytest.main(['-q', '-x', '-p', 'no:warnings', *{[os.path.join(here, f) for f in files]!r}]))")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout


def test_a_kernel_returning_a_tensor_subclass_gives_one_tensor():
    """A subclass of torch.Tensor is one output, even one whose iteration yields plain tensors
    (the C path must not take it for a sequence of outputs)."""
    from holoflow.core.registry import REGISTRY as reg, Op

    class Rows(torch.Tensor):
        def __iter__(self):
            return iter([torch.zeros(2) for _ in range(self.shape[0])])

    op = Op("subclass_result", lambda x: x.as_subclass(Rows) * 2, grad=lambda c, dy: (dy * 2,))
    assert "subclass_result" not in reg
    x = flow.ones(3, 2, requires_grad=True)
    for run in (FAST.eager, dispatch._eager_py):
        y = run(op, (x,), {})
        assert isinstance(y, Tensor) and tuple(y.shape) == (3, 2) and y.grad_fn is not None


def test_the_c_path_holds_no_extra_references():
    """Intermediate tensors and grad nodes made by the C path are freed by reference counting
    alone (the cyclic collector off) once nothing holds them: a reference the extension kept
    would keep them alive."""
    import gc
    import weakref
    gc.collect()
    gc.disable()
    try:
        x, w = _leaf(4, 6), _leaf(6)
        h = x.view(2, 12).t().reshape(4, 6) * 2                       # views of views, a product
        y = flow.nn.functional.layer_norm(h, (6,), w)                 # several outputs
        a, b = y.split([2, 2])                                        # several views
        loss = ((a + 1) * b).sum()                                    # a binary operator
        refs = [weakref.ref(t) for t in (h, y, a, b, loss)] + [weakref.ref(t.grad_fn) for t in (h, y, a, loss)]
        loss.backward()
        assert x.grad is not None and w.grad is not None
        del h, y, a, b, loss
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        gc.enable()
