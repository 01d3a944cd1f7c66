"""The op-table harness: every op against torch (forward, backward, gradcheck) and every SBP
signature against the unsharded result on simulated ranks (docs/architecture.md, "Testing").

A test module declares ``CASES = [Case(...), ...]`` and calls :func:`parametrize(CASES)`; the
SBP coverage test (tests/ops/test_sbp_coverage.py) gathers every module's cases.
"""
from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

import holoflow as flow
from holoflow.core.interpret import Observe, pushed
from holoflow.core.registry import REGISTRY, Meta
from holoflow.core.sbp import B, P, S, short

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


@dataclass
class Case:
    """One call of a public function, run under holoflow and under torch with equal inputs.

    ``make(dtype, gen)`` returns ``(args, kwargs)`` of torch tensors / plain values; floating
    tensors become differentiable inputs when ``grad`` is set.
    """

    name: str
    flow_fn: Callable
    torch_fn: Callable
    make: Callable[[torch.dtype, torch.Generator], tuple]
    grad: bool = True
    dtypes: tuple = (F32, F64)
    atol: float | None = None
    rtol: float | None = None
    random: bool = False          # compare shapes/statistics only, under one seed
    gradcheck: bool = True
    sbp: bool = True              # validate the SBP signatures of the ops it calls
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return self.name


def error_table_params(cases, xfail: dict) -> list:
    """The cases of a bad-input table as pytest params by id; those listed in ``xfail`` (id -> why:
    a fix that belongs to another owner's file) are strict xfails, which start failing once fixed."""
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=xfail[c.id])] if c.id in xfail else [])
            for c in cases]


def randn(*shape, gen=None, dtype=F32, low=None):
    t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return t if low is None else t.abs() + low


def positive(*shape, gen=None, dtype=F32):
    return torch.rand(shape, generator=gen, dtype=torch.float64).add(0.5).to(dtype)


def same_special(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-6, atol: float = 1e-9) -> bool:
    """Equal NaN patterns, equal infinities, finite values close (complex: per real and imaginary
    part): how the special-value sweeps compare holoflow's values and gradients with torch's."""
    a = torch.view_as_real(a.resolve_conj()) if a.is_complex() else a
    b = torch.view_as_real(b.resolve_conj()) if b.is_complex() else b
    if a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    a, b = a[~a.isnan()], b[~b.isnan()]
    if not torch.equal(a.isinf(), b.isinf()) or not torch.equal(a[a.isinf()], b[b.isinf()]):
        return False
    fin = ~a.isinf()
    return torch.allclose(a[fin], b[fin], rtol=rtol, atol=atol)


def torch_differentiates(fn: Callable, *args: torch.Tensor) -> bool:
    """Whether the installed torch has a derivative for ``fn(*args)`` (CPU tensors; the answer is
    the same on every device). Some derivatives came in later torch releases (``aminmax`` and
    ``nextafter``: not in 2.11, in 2.13); where one is missing, a case's reference is one whose
    gradient is the newer release's ATen formula, written with differentiable torch ops."""
    xs = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    try:
        outs = [o for o in leaves(fn(*xs)) if o.requires_grad]
        torch.autograd.grad([o.sum() for o in outs], [x for x in xs if x.requires_grad], allow_unused=True)
    except (NotImplementedError, RuntimeError) as e:
        if "not implemented" in str(e):
            return False
        raise
    return True


def to_flow(x, grad: bool):
    if isinstance(x, torch.Tensor):
        t = flow.from_torch(x.detach().clone())
        if grad and x.is_floating_point():
            t.requires_grad_(True)
        return t
    if isinstance(x, (list, tuple)):
        return type(x)(to_flow(v, grad) for v in x)
    if isinstance(x, dict):
        return {k: to_flow(v, grad) for k, v in x.items()}
    return x


def to_torch_leaf(x, grad: bool):
    if isinstance(x, torch.Tensor):
        t = x.detach().clone()
        if grad and x.is_floating_point():
            t.requires_grad_(True)
        return t
    if isinstance(x, (list, tuple)):
        return type(x)(to_torch_leaf(v, grad) for v in x)
    if isinstance(x, dict):
        return {k: to_torch_leaf(v, grad) for k, v in x.items()}
    return x


def leaves(x) -> list:
    if isinstance(x, (torch.Tensor, flow.Tensor)):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in leaves(v)]
    return []


def as_torch(x):
    return x.to_torch() if isinstance(x, flow.Tensor) else x


def tolerances(case: Case, dtype) -> dict:
    base = {F64: (1e-7, 1e-7), F32: (1e-5, 1e-4), BF16: (2e-2, 2e-2), torch.float16: (1e-2, 1e-2)}
    atol, rtol = base.get(dtype, (0, 0))
    return {"atol": case.atol if case.atol is not None and dtype != F64 else atol,
            "rtol": case.rtol if case.rtol is not None and dtype != F64 else rtol}


def assert_close(got, want, tol: dict, what: str, values: bool = True) -> None:
    """Shapes, dtypes, devices and (unless ``values`` is false: meta tensors hold none) values."""
    got, want = as_torch(got), as_torch(want)
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{what}: expected a tensor, got {type(got)}"
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != torch {tuple(want.shape)}"
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != torch {want.dtype}"
        assert got.device == want.device, f"{what}: device {got.device} != torch {want.device}"
        if not values:
            return
        if want.is_floating_point() or want.is_complex():
            torch.testing.assert_close(got, want, equal_nan=True, **tol, msg=lambda m: f"{what}: {m}")
        else:
            assert torch.equal(got, want), f"{what}: values differ from torch"
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{what}: {len(got)} outputs != torch {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, tol, f"{what}[{i}]", values)
    elif values or not isinstance(got, (torch.Tensor, flow.Tensor)):
        assert got == want, f"{what}: {got!r} != torch {want!r}"


def to_device(x, device):
    """``make``'s (args, kwargs) with every torch tensor moved to ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(to_device(v, device) for v in x)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    return x


def device_of(x) -> torch.device:
    """The device of the first tensor in ``x`` (the case's inputs), else the CPU."""
    ts = [t for t in leaves(x) if isinstance(t, torch.Tensor)]
    return ts[0].device if ts else torch.device("cpu")


def grad_of(lib, f: Callable) -> Callable:
    """The input gradients of ``f(lib, *xs)`` as a function of ``(*xs, dy)``: a case of it has a
    double backward for its backward (the grad ops' SBP rules are validated along the way)."""
    def run(*xs):
        *xs, dy = xs
        with lib.enable_grad():
            xs = [x if x.requires_grad else _leaf(x) for x in xs]
            return tuple(lib.autograd.grad([f(lib, *xs)], xs, [dy], create_graph=True))
    return run


def _leaf(x):
    t = x.detach()
    t.requires_grad_(True)
    return t


def quiet(fn: Callable) -> Callable:
    """``fn`` with its warnings silenced (deprecated aliases torch warns about)."""
    def run(*a, **k):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*a, **k)
    return run


def raised(fn: Callable[[], Any]) -> BaseException | None:
    """The exception ``fn()`` raises, or None."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the class is what callers compare
        return e
    return None


def error_like_torch(call: Callable[[Any], Any], what: str) -> BaseException:
    """``call(torch)`` raises, and ``call(holoflow)`` raises an exception of the same class whose
    message names holoflow (bad input gets torch's class and holoflow's message); returns it."""
    want, got = raised(lambda: call(torch)), raised(lambda: call(flow))
    assert want is not None, f"torch accepts {what}"
    assert got is not None, f"holoflow accepts {what} (torch raises {type(want).__name__}: {want})"
    assert isinstance(got, type(want)), f"{what}: holoflow {type(got).__mro__} ({got}), torch {type(want).__name__}"
    assert "holoflow" in str(got), f"{what}: {got}"
    return got


def run_case(case: Case, dtype, device=None) -> None:
    """Forward values and dtypes, then input gradients for a random upstream gradient.

    ``device``: the case's inputs are moved there first (default: where ``make`` put them). Every
    tensor the harness creates follows the inputs' device; on "meta" (no data) shapes, dtypes and
    devices are compared, values are not.
    """
    gen = torch.Generator().manual_seed(0)
    args, kwargs = case.make(dtype, gen)
    if device is not None:
        args, kwargs = to_device(args, device), to_device(kwargs, device)
    dev = device_of((args, kwargs))
    values = dev.type != "meta"
    fargs, fkw = to_flow(args, case.grad), to_flow(kwargs, case.grad)
    targs, tkw = to_torch_leaf(args, case.grad), to_torch_leaf(kwargs, case.grad)
    if case.random:
        flow.manual_seed(1)
        got = case.flow_fn(*fargs, **fkw)
        torch.manual_seed(1)
        want = case.torch_fn(*targs, **tkw)
    else:
        got = case.flow_fn(*fargs, **fkw)
        want = case.torch_fn(*targs, **tkw)
    tol = tolerances(case, dtype)
    assert_close(got, want, tol, f"{case.name} forward", values)
    if not case.grad:
        return
    t_outs = [o for o in leaves(want) if o.requires_grad]
    f_outs = [o for o in leaves(got) if o.requires_grad]
    t_ins = [x for x in leaves((targs, tkw)) if x.requires_grad]
    f_ins = [x for x in leaves((fargs, fkw)) if x.requires_grad]
    assert len(f_outs) == len(t_outs), f"{case.name}: {len(f_outs)} differentiable outputs vs torch {len(t_outs)}"
    if not t_outs or not t_ins:
        return
    # drawn on the CPU (the same numbers whatever the device), then moved to each output's device
    ups = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype).to(o.device) for o in t_outs]
    t_grads = torch.autograd.grad(t_outs, t_ins, ups, allow_unused=True)
    f_grads = flow.autograd.grad(f_outs, f_ins, [flow.from_torch(u) for u in ups], allow_unused=True)
    for i, (fg, tg) in enumerate(zip(f_grads, t_grads)):
        if tg is None:
            assert fg is None or fg.device == f_ins[i].device, f"{case.name}: grad {i} on {fg.device}, input on {f_ins[i].device}"
            assert fg is None or not values or torch.count_nonzero(fg.to_torch()) == 0, \
                f"{case.name}: grad {i} should be None/zero"
            continue
        assert fg is not None, f"{case.name}: holoflow gave no gradient for input {i}"
        assert_close(fg, tg, tol, f"{case.name} grad of input {i}", values)
        assert tg.device == t_ins[i].device, f"{case.name}: torch's grad {i} on {tg.device}, input on {t_ins[i].device}"


def gradcheck(case: Case, eps: float = 1e-6, trials: int = 2) -> None:
    """Finite differences in float64: <v, J u> from central differences equals <grad(v), u>."""
    gen = torch.Generator().manual_seed(0)
    args, kwargs = case.make(F64, gen)
    fargs, fkw = to_flow(args, True), to_flow(kwargs, True)
    ins = [x for x in leaves((fargs, fkw)) if x.requires_grad]
    for _ in range(trials if ins else 0):
        outs = [o for o in leaves(case.flow_fn(*fargs, **fkw)) if o.requires_grad]
        if not outs:
            return
        vs = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.to_torch().device) for o in outs]
        us = [torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.to_torch().device) for x in ins]
        grads = flow.autograd.grad(outs, ins, [flow.from_torch(v) for v in vs], allow_unused=True)
        analytic = sum(float((g.to_torch() * u).sum()) for g, u in zip(grads, us) if g is not None)

        def f(sign):
            with flow.no_grad():
                for x, u in zip(ins, us):
                    x._data.add_(sign * eps * u)
                o = [q.to_torch().clone() for q in leaves(case.flow_fn(*fargs, **fkw)) if q.is_floating_point()]
                for x, u in zip(ins, us):
                    x._data.sub_(sign * eps * u)
            return sum(float((a * v).sum()) for a, v in zip(o, vs))
        numeric = (f(1) - f(-1)) / (2 * eps)
        assert abs(numeric - analytic) <= 1e-5 * max(1.0, abs(numeric)), \
            f"{case.name}: gradcheck failed: finite differences {numeric} vs autograd {analytic}"


# -- SBP validation on simulated ranks ---------------------------------------------------------

def record_ops(case: Case) -> list[tuple]:
    """Runs the case under holoflow and returns every (op, torch inputs, attrs) it dispatched."""
    calls = []

    def pre(op, inputs, attrs):
        datas = tuple(x._data.detach().clone() if isinstance(x, flow.Tensor) else x for x in inputs)
        calls.append((op, datas, dict(attrs)))
        return inputs
    gen = torch.Generator().manual_seed(0)
    # (the widest dtype the case takes: partial sums of random pieces lose digits in half precision)
    args, kwargs = case.make(next((d for d in (F64, F32) if d in case.dtypes), case.dtypes[0]), gen)
    fargs, fkw = to_flow(args, case.grad), to_flow(kwargs, case.grad)
    with pushed(Observe(pre)):  # the forward ops and, for differentiable cases, the grad ops backward dispatches
        outs = [o for o in leaves(case.flow_fn(*fargs, **fkw)) if o.requires_grad]
        ins = [x for x in leaves((fargs, fkw)) if x.requires_grad]
        if case.grad and outs and ins and not case.random:
            flow.autograd.grad(outs, ins, [flow.ones_like(o) for o in outs], allow_unused=True)
    return calls


def shard(x: torch.Tensor, sbp, p: int, gen: torch.Generator) -> list:
    if isinstance(sbp, S):
        return list(torch.tensor_split(x, p, dim=sbp.axis))
    if sbp == B:
        return [x] * p
    parts = [torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.dtype).to(x.device) for _ in range(p - 1)]
    return parts + [x - sum(parts)]


def _inexact(t: torch.Tensor) -> bool:
    """Floating or complex: compared to rounding, not bit for bit."""
    return t.is_floating_point() or t.is_complex()


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.complex128) if t.is_complex() else t.double()


def combine(outs: list, sbp) -> torch.Tensor:
    if isinstance(sbp, S):
        return torch.cat(outs, dim=sbp.axis)
    if sbp == B:
        for o in outs[1:]:
            if not torch.allclose(_wide(o), _wide(outs[0]), atol=1e-6, equal_nan=True) if _inexact(o) else not torch.equal(o, outs[0]):
                raise AssertionError("ranks disagree on a broadcast output")
        return outs[0]
    return sum(outs[1:], outs[0])


def signatures(op, datas: tuple, attrs: dict) -> list:
    metas = [Meta.of(d) if isinstance(d, torch.Tensor) else d for d in datas]
    return op.sbp(metas, attrs)


def rank_call(op, datas: tuple, attrs: dict, shards: dict, in_sbps, r: int) -> tuple[list, dict]:
    """Rank ``r``'s inputs (its piece of each sharded tensor, ``shards``: input index -> pieces)
    and attributes (the op's ``local_attrs`` for those pieces)."""
    local = list(datas)
    for i, pieces in shards.items():
        local[i] = pieces[r]
    if op.local_attrs is None:
        return local, attrs
    metas = [Meta.of(d) if isinstance(d, torch.Tensor) else d for d in datas]
    return local, op.local_attrs(attrs, metas, [Meta.of(d) if isinstance(d, torch.Tensor) else d for d in local],
                                 in_sbps)


def check_signature(op, datas: tuple, attrs: dict, sig, p: int) -> str | None:
    """Returns None if the signature holds on ``p`` simulated ranks, else why it does not."""
    gen = torch.Generator().manual_seed(p)
    in_sbps, out_sbps = sig
    tens = [i for i, d in enumerate(datas) if isinstance(d, torch.Tensor)]
    if len(in_sbps) != len(tens):
        return f"signature has {len(in_sbps)} input SBPs for {len(tens)} tensor inputs"
    for i, s in zip(tens, in_sbps):
        if s == P and not _inexact(datas[i]):
            return None  # partial-sum of integers/bools is never produced; nothing to check
        if isinstance(s, S) and s.axis >= datas[i].dim():
            return f"split axis {s.axis} out of range for input {i} of dim {datas[i].dim()}"
    want = op.kernel(*datas, **attrs)
    wants = [want] if isinstance(want, torch.Tensor) else list(want)
    if op.local_attrs is not None and not _balanced(op, datas, attrs, sig, p, wants):
        return None  # shards not whole pieces of the output at p ranks: the chooser never offers it there
    shards = {i: shard(datas[i], s, p, gen) for i, s in zip(tens, in_sbps)}
    per_rank = []
    for r in range(p):
        local, a = rank_call(op, datas, attrs, shards, in_sbps, r)
        try:
            o = op.kernel(*local, **a)
        except Exception as e:  # a legal signature must run on every shard
            return f"rank {r} kernel failed: {str(e).splitlines()[0]}"
        per_rank.append([o] if isinstance(o, torch.Tensor) else list(o))
    if len(out_sbps) != len(wants):
        return f"signature has {len(out_sbps)} output SBPs for {len(wants)} outputs"
    for j, (s, w) in enumerate(zip(out_sbps, wants)):
        try:
            got = combine([pr[j] for pr in per_rank], s)
        except (AssertionError, RuntimeError) as e:
            return f"output {j}: {e}"
        if got.shape != w.shape:
            return f"output {j}: combined shape {tuple(got.shape)} != {tuple(w.shape)}"
        ok = torch.allclose(_wide(got), _wide(w), atol=1e-6, rtol=1e-5, equal_nan=True) \
            if _inexact(w) else torch.equal(got, w)
        if not ok:
            return f"output {j}: combined values differ from the unsharded result"
    return None


def _balanced(op, datas: tuple, attrs: dict, sig, p: int, wants: list) -> bool:
    """Whether ``global_dispatch.choose`` would offer ``sig`` on ``p`` ranks (every shard computes
    its balanced piece of the output)."""
    from holoflow.distributed.global_dispatch import _consistent
    metas = [Meta.of(d) if isinstance(d, torch.Tensor) else d for d in datas]
    nd = (tuple((s,) for s in sig[0]), tuple((s,) for s in sig[1]))
    return _consistent(op, metas, attrs, nd, flow.placement("cpu", list(range(p))), [Meta.of(w) for w in wants])


def sig_str(sig) -> str:
    ins, outs = sig
    return f"({', '.join(map(short, ins))}) -> ({', '.join(map(short, outs))})"


VALIDATED: dict[str, int] = {}


def check_sbp(case: Case) -> None:
    """Every declared signature of every op the case dispatches, on 2 and 3 simulated ranks."""
    failures = []
    for op, datas, attrs in record_ops(case):
        assert op.sbp is not None, f"op {op.name!r} declares no SBP signatures (missing rule)"
        sigs = signatures(op, datas, attrs)
        assert sigs, f"op {op.name!r} declares an empty signature list for {case.name}"
        if op.random:
            VALIDATED[op.name] = VALIDATED.get(op.name, 0) + len(sigs)
            continue  # values are seed-dependent: random ops are checked by their own tests
        for sig, p in itertools.product(sigs, (2, 3)):
            why = check_signature(op, datas, attrs, sig, p)
            if why:
                failures.append(f"{op.name} {sig_str(sig)} on {p} ranks: {why}")
        VALIDATED[op.name] = VALIDATED.get(op.name, 0) + len(sigs)
    assert not failures, "wrong SBP rules:\n" + "\n".join(failures)


def parametrize(cases: list[Case]) -> dict[str, Any]:
    """Test functions for a module's cases: import them into the test module's namespace."""
    fwd = [pytest.param(c, d, id=f"{c.name}-{str(d).split('.')[-1]}") for c in cases for d in c.dtypes]

    @pytest.mark.parametrize("case,dtype", fwd)
    def test_vs_torch(case, dtype):
        run_case(case, dtype)

    @pytest.mark.parametrize("case", [c for c in cases if c.grad and c.gradcheck and not c.random], ids=repr)
    def test_gradcheck(case):
        gradcheck(case)

    @pytest.mark.parametrize("case", [c for c in cases if c.sbp], ids=repr)
    def test_sbp_rules(case):
        check_sbp(case)

    tests = {"test_vs_torch": test_vs_torch, "test_gradcheck": test_gradcheck, "test_sbp_rules": test_sbp_rules}
    # (a module of non-differentiable ops has no gradcheck: no empty, skipped test)
    return {k: v for k, v in tests.items() if v.pytestmark[0].args[1]}


def registry():
    return REGISTRY


def broadcasts(src: tuple, dst: tuple, exact: bool = False) -> bool:
    """Whether shape ``src`` broadcasts with ``dst`` (``exact``: onto ``dst`` itself, as an
    in-place operand must)."""
    try:
        out = torch.broadcast_shapes(src, dst)
    except RuntimeError:
        return False
    return out == dst if exact else True


def sweep(check: Callable[..., bool], cases) -> None:
    """Runs ``check(failures, *case)`` for every case (a check appends what differs from torch to
    ``failures`` and returns whether torch computed the case); fails listing the mismatches, or
    when torch computed none of them (a sweep that checks nothing)."""
    failures: list = []
    computed = sum(check(failures, *case) for case in cases)
    assert not failures, "\n".join(failures[:20])
    assert computed > 0


def same_as_torch(failures: list, name: str, torch_call, flow_call) -> bool:
    """Compares one call where torch computes it; returns whether it did."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = torch_call()
    except Exception:
        return False
    try:
        got = flow_call()
    except Exception as e:
        failures.append(f"{name}: {e}")
        return True
    wants = want if isinstance(want, (tuple, list)) else [want]
    gots = got if isinstance(got, (tuple, list)) else [got]
    if len(wants) != len(gots):
        failures.append(f"{name}: {len(gots)} outputs, torch {len(wants)}")
        return True
    for g, w in zip(gots, wants):
        if not isinstance(w, torch.Tensor):
            if g != w:
                failures.append(f"{name}: {g!r}, torch {w!r}")
            continue
        g = g.to_torch() if isinstance(g, flow.Tensor) else g
        if not isinstance(g, torch.Tensor) or (g.dtype, g.shape) != (w.dtype, w.shape):
            failures.append(f"{name}: {getattr(g, 'dtype', type(g))} {tuple(getattr(g, 'shape', ()))}, torch "
                            f"{w.dtype} {tuple(w.shape)}")
        elif not torch.equal(g, w) and not (w.is_floating_point() and torch.allclose(g, w, rtol=1e-5, atol=1e-6,
                                                                                     equal_nan=True)):
            failures.append(f"{name}: values differ")
    return True
