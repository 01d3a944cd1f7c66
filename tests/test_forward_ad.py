"""``holoflow.autograd.forward_ad`` (dual tensors) against torch's forward-mode AD: every op-table
case's tangents, the semantics around reverse mode (views, in-place writes, no_grad, forward
over reverse, leaving the level) and the refusals (reverse over forward, global tensors, traces).
"""
from __future__ import annotations

import contextlib
import importlib
import pkgutil

import pytest
import torch
import torch.autograd.forward_ad as tfw
from torch.nn.attention import SDPBackend, sdpa_kernel

import holoflow as flow
import holoflow.autograd.forward_ad as ffw
import ops as ops_tests
from harness import leaves

F64 = torch.float64

# Where torch raises (no forward formula, a custom Function, an out= kernel) holoflow raises the
# same class or its kernel is a composition torch differentiates: its tangents are then checked
# against central differences of torch's function. So are the cases where torch's tangents
# differ from J t: triangular_solve reads only A's triangle, torch's forward formula the
# tangent's other triangle too (its reverse mode agrees with J t, as holoflow's does);
# torch.cond and torch's chunked linear_cross_entropy give no tangent.
NUMERICAL_INSTEAD = ("triangular_solve", "cond-", "linear_cross_entropy-chunked")
EXACT, NUMERICAL = dict(rtol=1e-5, atol=1e-7), dict(rtol=1e-4, atol=1e-6)
# torch's case writes out of place where holoflow's writes in place: torch's in-place forms have
# no forward formula either (holoflow raises torch's NotImplementedError)
TORCH_OUT_OF_PLACE = ("acosh_-view-grad", "asinh_-view-grad", "atanh_-view-grad", "arccosh_-view-grad",
                      "arcsinh_-view-grad", "arctanh_-view-grad")
# forward over reverse through holoflow's backward formula of logcumsumexp: its -inf fills give
# NaN tangents where torch's formula stays finite
NAN_TANGENTS = {"grad-of-logcumsumexp"}


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.iter_modules(ops_tests.__path__)
                  if info.name.startswith("test_") and info.name != "test_device_consistency")


def _tmap(fn, x):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_tmap(fn, v) for v in x)
    if isinstance(x, dict):
        return {k: _tmap(fn, v) for k, v in x.items()}
    return x


class _Pair(tuple):
    """A primal and its tangent."""


def _duals(paired, lib):
    """The case's arguments of ``lib`` with every floating input a dual tensor."""
    def conv(v):
        if isinstance(v, _Pair):
            if lib is torch:
                return tfw.make_dual(v[0].clone(), v[1])
            return ffw.make_dual(flow.from_torch(v[0].clone()), flow.from_torch(v[1]))
        if isinstance(v, torch.Tensor):
            return v.clone() if lib is torch else flow.from_torch(v.clone())
        if isinstance(v, (list, tuple)):
            return type(v)(conv(u) for u in v)
        if isinstance(v, dict):
            return {k: conv(u) for k, u in v.items()}
        return v
    return conv(paired)


def _tangents(case, paired, lib, fw):
    with fw.dual_level():
        args, kwargs = _duals(paired, lib)
        out = (case.torch_fn if lib is torch else case.flow_fn)(*args, **kwargs)
        return [fw.unpack_dual(o).tangent for o in leaves(out)]


def _numerical(case, paired, eps: float = 1e-6) -> list:
    """J t by central differences of torch's own function (float64): (f(x + eps t) - f(x - eps t)) / 2 eps
    for every floating output (None for the others)."""
    def at(sign):
        args, kwargs = _unpair(paired, lambda p: p[0] + sign * eps * p[1])
        return [o.detach() for o in leaves(case.torch_fn(*args, **kwargs))]
    lo, hi = at(-1), at(1)
    return [(b - a) / (2 * eps) if a.is_floating_point() or a.is_complex() else None for a, b in zip(lo, hi)]


def _unpair(v, fn):
    if isinstance(v, _Pair):
        return fn(v)
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_unpair(u, fn) for u in v)
    if isinstance(v, dict):
        return {k: _unpair(u, fn) for k, u in v.items()}
    return v


def _same_tangents(name, got, want, tol):
    assert len(got) == len(want), f"{name}: {len(got)} outputs vs {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None or g is None:
            # (an empty output: holoflow's shortcut makes it without the inputs, so no tangent)
            empty = (w if g is None else g).numel() == 0 if (w is not None or g is not None) else True
            assert (w is None) == (g is None) or empty, f"{name}: tangent {i} is None on one side only"
            continue
        g = g.to_torch() if isinstance(g, flow.Tensor) else g
        w = w.to_torch() if isinstance(w, flow.Tensor) else w
        assert g.shape == w.shape, f"{name}: tangent {i} of shape {tuple(g.shape)} vs {tuple(w.shape)}"
        torch.testing.assert_close(g.to(w.dtype), w, **tol, equal_nan=True,
                                   msg=lambda m: f"{name}: tangent {i}: {m}")


@pytest.mark.parametrize("module", _modules())
def test_every_op_table_case_has_torchs_tangents(module):
    mod = importlib.import_module(f"ops.{module}")
    checked = 0
    for case in getattr(mod, "CASES", []):
        if case.random or not case.grad or F64 not in case.dtypes:
            continue
        gen = torch.Generator().manual_seed(0)
        args, kwargs = case.make(F64, gen)
        paired = _tmap(lambda x: _Pair((x, torch.randn(x.shape, generator=gen, dtype=x.dtype)))
                       if x.is_floating_point() or x.is_complex() else x, (args, kwargs))
        try:
            want = _tangents(case, paired, torch, tfw)
        except (NotImplementedError, RuntimeError) as e:
            want = e
        if case.name in TORCH_OUT_OF_PLACE:
            with pytest.raises(NotImplementedError, match="forward AD"):
                _tangents(case, paired, flow, ffw)
            continue
        if isinstance(want, BaseException):   # holoflow raises torch's error, or its kernel has J t
            try:
                got = _tangents(case, paired, flow, ffw)
            except type(want):
                checked += 1
                continue
            want, tol = _numerical(case, paired), NUMERICAL
        else:
            got, tol = _tangents(case, paired, flow, ffw), EXACT
        if case.name in NAN_TANGENTS:
            assert any(g is not None and bool(g.to_torch().isnan().any()) for g in got), \
                f"{case.name}: no NaN tangent any more: move it out of NAN_TANGENTS"
            continue
        if any(case.name.startswith(p) for p in NUMERICAL_INSTEAD):
            want, tol = _numerical(case, paired), NUMERICAL
        _same_tangents(case.name, got, want, tol)
        checked += 1
    assert checked or not any(c.grad and not c.random and F64 in c.dtypes for c in getattr(mod, "CASES", [])), \
        f"{module}: no case checked"


# -- semantics against torch ------------------------------------------------------------------


def _both(fn, *tensors):
    """``fn(lib, fw, *xs)`` under torch and under holoflow, the inputs converted."""
    return fn(torch, tfw, *[t.clone() for t in tensors]), \
        fn(flow, ffw, *[flow.from_torch(t.clone()) for t in tensors])


def _t(x):
    return None if x is None else x.to_torch() if isinstance(x, flow.Tensor) else x


X = torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(1))
T = torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(2))
W = torch.randn(4, 5, dtype=F64, generator=torch.Generator().manual_seed(3))


def test_a_model_jvp_equals_torchs():
    """A transformer block (layer norm, attention by sdpa, GELU MLP, residuals) along a tangent.
    torch's CPU flash kernel has no forward formula (its call raises); holoflow's attention takes
    the math path for dual inputs, torch's under sdpa_kernel(MATH)."""
    def run(lib, fw, x, t):
        lib.manual_seed(0)
        block = lib.nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0, batch_first=True,
                                               activation="gelu").double()
        math_only = sdpa_kernel(SDPBackend.MATH) if lib is torch else contextlib.nullcontext()
        with fw.dual_level(), math_only:
            out = block(fw.make_dual(x.reshape(1, 3, 4), t.reshape(1, 3, 4)))
            p, tangent = fw.unpack_dual(out)
            return _t(p).detach(), _t(tangent).detach()
    (tp, tt), (fp, ft) = _both(run, X, T)
    torch.testing.assert_close(fp, tp)
    torch.testing.assert_close(ft, tt)


def test_reverse_mode_runs_alongside():
    """The dual is a view of the tensor on the tape: x.grad as torch's; the primal of an output
    keeps its history; tangents require grad as torch's (from a tensor that requires grad)."""
    def run(lib, fw, x, t, w):
        x.requires_grad_(True)
        with fw.dual_level():
            d = fw.make_dual(x, t)
            y = (d @ w).tanh()
            p, tangent = fw.unpack_dual(y)
            flags = (d.requires_grad, tangent.requires_grad, p.requires_grad)
            (p.sum() + y.pow(2).sum()).backward()
        return _t(x.grad), _t(tangent).detach(), flags
    want, got = _both(run, X, T, W)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    assert got[2] == want[2] == (True, True, True)


def test_views_in_place_writes_no_grad_and_copies_carry_tangents():
    def run(lib, fw, x, t):
        with fw.dual_level():
            d = fw.make_dual(x, t)
            y = d * 1
            y[1:].mul_(2)                       # a write through a view moves the base's tangent
            with lib.no_grad():                 # forward mode runs through no_grad
                z = y.exp()
            plain = lib.zeros(3, 4, dtype=F64)
            plain[:, :2].copy_(z[:, 1:3])       # a plain tensor written with a dual becomes one
            a, b = lib.unsafe_split(y * 1, 2)   # unsafe pieces: their writes reach the base's tangent
            a.mul_(3)
            s = y.t().clone()
            s.t_().unsqueeze_(0)                # in-place shape methods keep the tangent
            outs = (z, plain, y.detach(), a, b, s)
            return [_t(fw.unpack_dual(o).tangent) for o in outs]
    want, got = _both(run, X, T)
    assert [w is None for w in want] == [g is None for g in got] == [False, False, True, False, False, False]
    for g, w in zip(got, want):
        if w is not None:
            torch.testing.assert_close(g, w)


def test_forward_over_reverse_gives_hessian_vector_products():
    def run(lib, fw, x, t):
        x.requires_grad_(True)
        with fw.dual_level():
            d = fw.make_dual(x, t)
            g, = lib.autograd.grad((d.sin() * d).sum(), d, create_graph=True)
            return _t(fw.unpack_dual(g).tangent).detach()
    want, got = _both(run, X, T)
    torch.testing.assert_close(got, want)


def test_leaving_the_level_drops_every_tangent_and_levels_do_not_nest():
    for fw, conv in ((tfw, lambda v: v), (ffw, flow.from_torch)):
        with fw.dual_level():
            y = fw.make_dual(conv(X.clone()), conv(T.clone())) * 2
            assert fw.unpack_dual(y).tangent is not None
            with pytest.raises(RuntimeError, match="Nested forward mode AD is not supported"):
                with fw.dual_level():
                    pass
        assert fw.unpack_dual(y).tangent is None
        assert fw.unpack_dual(conv(X)).tangent is None


def test_dual_level_decorates_a_function():
    @ffw.dual_level()
    def jvp_of_sin(x, t):
        return ffw.unpack_dual(ffw.make_dual(x, t).sin()).tangent
    got = jvp_of_sin(flow.from_torch(X), flow.from_torch(T))
    torch.testing.assert_close(got.to_torch(), X.cos() * T)


def test_bad_duals_are_refused_with_torchs_classes():
    x, t = flow.from_torch(X), flow.from_torch(T)
    with pytest.raises(RuntimeError, match="no level exists"):
        ffw.make_dual(x, t)
    with ffw.dual_level():
        with pytest.raises(RuntimeError, match=r"make_dual \(tensor \(3, 4\).*tangent \(2, 4\).*different size"):
            ffw.make_dual(x, t[:2])
        with pytest.raises(ValueError, match="floating point or complex"):
            ffw.make_dual(flow.arange(3), flow.arange(3))
        with pytest.raises(TypeError, match="expected tensor to be a holoflow Tensor, got Tensor"):
            ffw.make_dual(X, t)


def test_reverse_over_forward_is_refused_naming_func_jvp():
    """torch differentiates a tangent (torch records it); holoflow's tape cannot see inside a
    tangent, so a backward reaching one raises, and a tangent that requires grad is refused."""
    w = flow.from_torch(W).requires_grad_(True)
    with ffw.dual_level():
        y = ffw.make_dual(flow.from_torch(X), flow.from_torch(T)) @ w
        tangent = ffw.unpack_dual(y).tangent
        assert tangent.requires_grad
        with pytest.raises(RuntimeError, match="holoflow.func.jvp"):
            tangent.sum().backward()
        tangent.detach().sum()   # (detached, it is a plain value)
        with pytest.raises(RuntimeError, match="the tangent requires grad.*holoflow.func.jvp"):
            ffw.make_dual(flow.from_torch(X), w[:, :4].t()[:3] * 1)


def test_global_tensors_and_traces_refuse_duals():
    g = flow.from_torch(X).to_global(placement=flow.placement("cpu", [0]), sbp=flow.sbp.broadcast)
    with ffw.dual_level():
        with pytest.raises(RuntimeError, match=r"tensor is a global tensor .*to_local\(\)"):
            ffw.make_dual(g, flow.from_torch(T))

        class Dualize(flow.nn.Graph):
            def build(self, x):
                return ffw.make_dual(x, x * 0 + 1)
        with pytest.raises(RuntimeError, match="not inside an nn.Graph or holoflow.compile trace"):
            Dualize()(flow.from_torch(X))

        class Double(flow.nn.Graph):
            def build(self, x):
                return x * 2
        dual = ffw.make_dual(flow.from_torch(X), flow.from_torch(T))
        with pytest.raises(RuntimeError, match="nn.Graph Double: an input is a forward-AD dual tensor"):
            Double()(dual)
        with pytest.raises(RuntimeError, match="nn.Graph Double: an input is a forward-AD dual tensor"):
            list(Double().stream([(dual,)]))


def test_compiled_calls_run_eagerly_in_a_dual_level():
    """holoflow.compile's traced kernels would drop tangents: in a dual level a compiled call runs
    its function eagerly (torch's tangents), outside it is traced as before."""
    flow.manual_seed(0)
    lin = flow.nn.Linear(4, 2).double()
    compiled = flow.compile(lin, backend="eager")
    x, t = flow.from_torch(X), flow.from_torch(T)
    with ffw.dual_level():
        tangent = ffw.unpack_dual(compiled(ffw.make_dual(x, t))).tangent
    torch.testing.assert_close(tangent.to_torch(), (t @ lin.weight.t()).detach().to_torch())
    torch.testing.assert_close(compiled(x).detach().to_torch(), lin(x).detach().to_torch())


def test_mock_torch_code_imports_forward_ad():
    from holoflow import mock_torch
    with mock_torch.enable():
        import torch as mocked
        import torch.autograd.forward_ad as fw
        assert fw.make_dual is ffw.make_dual and fw.dual_level is ffw.dual_level
        with fw.dual_level():
            x = fw.make_dual(mocked.ones(2, dtype=mocked.float64), mocked.full((2,), 3.0, dtype=mocked.float64))
            tangent = fw.unpack_dual((x * x).sum()).tangent
    assert float(tangent) == 12.0
