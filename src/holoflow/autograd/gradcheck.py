"""``holoflow.autograd.gradcheck``: torch's ``gradcheck`` / ``gradgradcheck`` over holoflow
functions: Jacobians by central finite differences (the inputs perturbed in place, out of
autograd's sight, as torch's ``.data``) against holoflow's own autograd (one ``autograd.grad``
per output element, or, in ``fast_mode``, one random projection ``v^T J u``, torch's vectors).
Complex outputs are checked by their real and imaginary parts, complex inputs by the conjugate
Wirtinger derivative torch's convention gives. ``check_forward_ad`` checks forward mode
(autograd/forward_ad.py) the same way: one dual evaluation per input element (the Jacobian's
row), or, in ``fast_mode``, one along a random ``u`` per input, for real inputs and outputs.
"""
from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence

import torch

from ..core import generators
from ..core.autograd import run_backward
from ..core.errors import UnsupportedError
from ..core.tensor import Tensor
from . import forward_ad
from . import grad as _grad

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


class GradcheckError(RuntimeError):
    """Error raised by :func:`gradcheck` and :func:`gradgradcheck`."""


_PREFIX = "holoflow.autograd.gradcheck: "


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else tuple(x) if isinstance(x, list) else (x,)


def _differentiable(outs) -> tuple:
    return tuple(o for o in _as_tuple(outs) if isinstance(o, Tensor) and o.requires_grad)


def _diff_inputs(inputs: tuple) -> list:
    return [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]


def gradcheck(func: Callable[..., Tensor | Sequence[Tensor]], inputs: Tensor | Sequence[Tensor], *,
              eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3, raise_exception: bool = True,
              nondet_tol: float = 0.0, check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
              check_batched_grad: bool = False, check_batched_forward_grad: bool = False,
              check_forward_ad: bool = False, check_backward_ad: bool = True, fast_mode: bool = False,
              masked: bool | None = None) -> bool:
    """Checks the gradients of ``func`` at ``inputs`` (those that require grad, best in float64)
    against finite differences; True, or GradcheckError (False with ``raise_exception=False``)."""
    if not (check_forward_ad or check_backward_ad):
        raise AssertionError(_PREFIX + "Expected at least one of check_forward_ad or check_backward_ad to be True")
    if check_batched_grad and not check_backward_ad:
        raise AssertionError(_PREFIX + "Setting check_batched_grad=True requires check_backward_ad to be True")
    if check_batched_forward_grad and not check_forward_ad:
        raise AssertionError(_PREFIX + "Setting check_batched_forward_grad=True requires check_forward_ad to be True")
    if check_batched_forward_grad:
        raise UnsupportedError("holoflow.autograd.gradcheck: check_batched_forward_grad=True (forward mode under "
                               "vmap) is not supported; check_forward_ad=True checks forward mode unbatched")
    try:
        if check_backward_ad:
            _check(func, _as_tuple(inputs), eps, atol, rtol, nondet_tol, check_undefined_grad,
                   check_grad_dtypes, check_batched_grad, fast_mode)
        if check_forward_ad:
            _check_forward(func, _as_tuple(inputs), eps, atol, rtol, fast_mode)
        return True
    except GradcheckError as e:
        if raise_exception:
            if not str(e).startswith(_PREFIX):   # (torch's text after holoflow's prefix)
                e.args = (_PREFIX + str(e),)
            raise
        return False


def _check(func, inputs, eps, atol, rtol, nondet_tol, check_undefined_grad, check_grad_dtypes,
           check_batched_grad, fast_mode) -> bool:
    _check_inputs(inputs)
    func_out = func(*inputs)
    outputs = _differentiable(func_out)
    if not outputs:   # then every numerical derivative must be zero
        for per_input in _numerical(func, inputs, eps):
            if any(bool(torch.ne(j, 0).any()) for j in per_input):
                raise GradcheckError("Numerical gradient for function expected to be zero")
        return True
    complex_outs = [i for i, o in enumerate(outputs) if o.is_complex()]
    check = _fast if fast_mode else _slow
    if complex_outs:   # the imaginary parts, then the real parts (torch's order)
        for part, imag in ((lambda o: o.imag, True), (lambda o: o.real, False)):
            f = _parts(func, part)
            check(f, inputs, _differentiable(f(*inputs)), eps, rtol, atol, nondet_tol, check_grad_dtypes,
                  complex_outs, imag)
    else:
        check(func, inputs, outputs, eps, rtol, atol, nondet_tol, check_grad_dtypes, (), False)
    if check_batched_grad:
        for i, o in enumerate(outputs):
            _batched(inputs, o, i)
    _mul_by_grad_output(outputs, inputs)
    if check_undefined_grad:
        _undefined_grads(func, inputs)
    return True


def _check_forward(func, inputs: tuple, eps: float, atol: float, rtol: float, fast_mode: bool) -> None:
    """Forward mode against finite differences: per input, its Jacobian's rows from one dual
    evaluation per element (the input's tangent a unit vector), or in ``fast_mode`` ``J u`` along
    one random unit ``u``; the other inputs carry no tangent."""
    _check_inputs(inputs)
    diff = _diff_inputs(inputs)
    outs = [o for o in _as_tuple(func(*inputs)) if isinstance(o, Tensor)]
    if any(x.is_complex() for x in diff) or any(o.is_complex() for o in outs):
        raise UnsupportedError(_PREFIX + "check_forward_ad=True checks real inputs and outputs; check complex "
                               "ones by reverse mode (check_backward_ad=True)")

    def along(i: int, tangent: torch.Tensor) -> list:
        """J_i t, flattened per output: the outputs' tangents with input ``i`` dual (zeros where none)."""
        with forward_ad.dual_level():
            args = list(inputs)
            k = next(j for j, x in enumerate(inputs) if x is diff[i])
            args[k] = forward_ad.make_dual(diff[i].detach(), Tensor._make(tangent.reshape(diff[i].shape)))
            res = [o for o in _as_tuple(func(*args)) if isinstance(o, Tensor)]
            tangents = [forward_ad.unpack_dual(o).tangent for o in res]
            return [torch.zeros(o._data.numel(), dtype=o._data.dtype) if t is None else
                    t._data.detach().reshape(-1).clone() for o, t in zip(res, tangents)]

    gen = torch.Generator()
    numerical = None if fast_mode else _numerical(func, inputs, eps)   # [input][output] (in numel, out numel)
    for i, x in enumerate(diff):
        d = x._data
        if fast_mode:
            u = _unit(d.numel(), gen, d.dtype)
            wants = _central(func, inputs, x._data.data, (eps * u).reshape(d.shape), eps)
            gots = along(i, u)
        else:
            rows = [along(i, torch.zeros(d.numel(), dtype=d.dtype).index_fill_(0, torch.tensor([k]), 1))
                    for k in range(d.numel())]
            gots = [torch.stack([r[j] for r in rows]) if rows else torch.zeros(0, o._data.numel(), dtype=d.dtype)
                    for j, o in enumerate(outs)]
            wants = numerical[i]
        for j, (a, n) in enumerate(zip(gots, wants)):
            if not outs[j].is_floating_point():
                continue
            if not _allclose(a, n, rtol, atol):
                raise GradcheckError(f"Jacobian computed with forward mode mismatch for output {j:d} with respect "
                                     f"to input {i:d},\nnumerical:{n}\nanalytical:{a}\n")


def _parts(func, part) -> Callable:
    def wrapped(*args):
        return tuple(part(o) if isinstance(o, Tensor) and o.is_complex() else o for o in _as_tuple(func(*args)))
    return wrapped


def _check_inputs(inputs: tuple) -> None:
    any_rg = False
    for idx, x in enumerate(inputs):
        if not (isinstance(x, Tensor) and x.requires_grad):
            continue
        if x._data.dtype not in (torch.float64, torch.complex128):
            warnings.warn(f"Input #{idx} requires gradient and is not a double precision floating point or "
                          f"complex. This check will likely fail if all the inputs are not of double precision "
                          f"floating point or complex. ", stacklevel=4)
        if not all(st > 0 or sz <= 1 for st, sz in zip(x._data.stride(), x._data.size())):
            raise RuntimeError(f"holoflow.autograd.gradcheck: the {idx}th input has a dimension with stride 0. "
                               f"gradcheck only supports inputs that are non-overlapping to be able to compute "
                               f"the numerical gradients correctly; call .contiguous() on the input first")
        any_rg = True
    if not any_rg:
        raise ValueError(_PREFIX + "gradcheck expects at least one input tensor to require gradient, but none of them "
                         "have requires_grad=True.")


# -- numerical side ------------------------------------------------------------------------------

def _evaluate(func, inputs) -> tuple:
    """``func``'s outputs as torch tensors (copies: the inputs change again right after)."""
    return tuple(o._data.detach().clone() for o in _as_tuple(func(*inputs)) if isinstance(o, Tensor))


def _central(func, inputs, entry: torch.Tensor, delta, eps: float) -> tuple:
    """(f(x + delta) - f(x - delta)) / 2 eps, flattened per output, with ``entry`` (a slot of an
    input's storage, seen through ``.data``: no version moves) perturbed in place."""
    orig = entry.clone()
    entry.copy_(orig - delta)
    a = _evaluate(func, inputs)
    entry.copy_(orig + delta)
    b = _evaluate(func, inputs)
    entry.copy_(orig)
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            raise AssertionError(f"{_PREFIX}Expected `func` to return outputs with the same shape and dtype when "
                                 f"inputs are perturbed, but got {tuple(x.shape)} {x.dtype} and {tuple(y.shape)} "
                                 f"{y.dtype}")
    return tuple(((y - x) / (2 * eps)).reshape(-1) for x, y in zip(a, b))


def _numerical(func, inputs: tuple, eps: float) -> list:
    """Per differentiable input, one Jacobian per output, shaped (input numel, output numel)."""
    result = []
    for x in _diff_inputs(inputs):
        data = x._data.data
        cols = []
        for idx in itertools.product(*[range(n) for n in data.shape]):
            entry = data[idx]
            ds_dx = _central(func, inputs, entry, eps, eps)
            if data.is_complex():   # C -> R: the conjugate Wirtinger derivative, as torch's
                ds_dy = _central(func, inputs, entry, eps * 1j, eps)
                ds_dx = tuple(dx + dy * 1j for dx, dy in zip(ds_dx, ds_dy))
            cols.append(ds_dx)
        if cols:
            result.append([torch.stack([c[k] for c in cols]) for k in range(len(cols[0]))])
        else:   # an empty input: empty Jacobians
            result.append([torch.zeros(0, o.numel(), dtype=data.dtype) for o in _evaluate(func, inputs)])
    return result


# -- analytical side -----------------------------------------------------------------------------

def _vjp(output: Tensor, inputs: list, v: torch.Tensor) -> tuple:
    return _grad(output, inputs, Tensor._make(v), retain_graph=True, allow_unused=True)


def _analytical(output: Tensor, inputs: list, nondet_tol: float, check_grad_dtypes: bool) -> list:
    """Per input, the Jacobian of ``output`` (input numel, output numel), from one vjp per output
    element; computed twice, the two must agree within ``nondet_tol``."""
    def once():
        d = output._data
        jac = [torch.zeros(x._data.numel(), d.numel(), dtype=x._data.dtype) for x in inputs]
        for j in range(d.numel()):
            v = torch.zeros(d.numel(), dtype=d.dtype, device=d.device)
            v[j] = 1
            for i, g in enumerate(_vjp(output, inputs, v.reshape(d.shape))):
                if g is not None:
                    _check_grad_attributes(g, inputs[i], check_grad_dtypes)
                    jac[i][:, j] = g._data.reshape(-1).to(jac[i].dtype)
        return jac
    first, second = once(), once()
    for a, b in zip(first, second):
        if a.numel() and float((a - b).abs().max()) > nondet_tol:
            raise GradcheckError(f"Backward is not reentrant, i.e., running backward with same input and "
                                 f"grad_output multiple times gives different values, although analytical "
                                 f"gradient matches numerical gradient.The tolerance for nondeterminism was "
                                 f"{nondet_tol}.")
    return first


def _check_grad_attributes(g: Tensor, x: Tensor, check_grad_dtypes: bool) -> None:
    if tuple(g.shape) != tuple(x.shape):
        raise GradcheckError("Analytical gradient has incorrect size")
    if check_grad_dtypes and g._data.dtype != x._data.dtype:
        raise GradcheckError("Gradient has dtype mismatch")


def _mismatch(a, n, out_idx: int, in_idx: int, complex_outs, imag: bool) -> str:
    prefix = ""
    if complex_outs and out_idx in complex_outs:
        prefix = f"While considering the {'imaginary' if imag else 'real'} part of complex outputs only, "
    return (f"{prefix}Jacobian mismatch for output {out_idx:d} with respect to input {in_idx:d},\n"
            f"numerical:{n}\nanalytical:{a}\n")


def _allclose(a: torch.Tensor, n: torch.Tensor, rtol: float, atol: float) -> bool:
    dt = torch.promote_types(a.dtype, n.dtype)
    return torch.allclose(a.to(dt), n.to(dt), rtol, atol)


def _slow(func, inputs, outputs, eps, rtol, atol, nondet_tol, check_grad_dtypes, complex_outs, imag) -> None:
    func_out = [o for o in _as_tuple(func(*inputs)) if isinstance(o, Tensor)]
    numerical = _numerical(func, inputs, eps)   # [input][output], every output
    keep = [k for k, o in enumerate(func_out) if o.requires_grad]
    diff = _diff_inputs(inputs)
    for i, o in enumerate(outputs):
        analytical = _analytical(o, diff, nondet_tol, check_grad_dtypes)
        for j, a in enumerate(analytical):
            n = numerical[j][keep[i]]
            if not _allclose(a, n, rtol, atol):
                raise GradcheckError(_mismatch(a, n, i, j, complex_outs, imag))


def _fast(func, inputs, outputs, eps, rtol, atol, nondet_tol, check_grad_dtypes, complex_outs, imag) -> None:
    """torch's fast mode: ``v^T J u`` for random unit ``u`` per input and ``v`` per output (the
    same generator and draws as torch's), numerically along ``u`` and analytically by one vjp."""
    gen = torch.Generator()
    diff = _diff_inputs(inputs)
    all_u = []
    for x in diff:
        d = x._data
        ur = _unit(d.numel(), gen, _real_dtype(d.dtype))
        all_u.append((ur, _unit(d.numel(), gen, _real_dtype(d.dtype))) if d.is_complex() else ur)
    all_v = [_unit(o._data.numel(), gen, o._data.dtype) for o in outputs]
    keep = [k for k, o in enumerate(o for o in _as_tuple(func(*inputs)) if isinstance(o, Tensor)) if o.requires_grad]
    for i, (x, u) in enumerate(zip(diff, all_u)):
        data = x._data.data
        ur = u[0] if isinstance(u, tuple) else u
        ju = _central(func, inputs, data, (eps * ur).reshape(data.shape), eps)
        if data.is_complex():
            jv = _central(func, inputs, data, (eps * u[1] * 1j).reshape(data.shape), eps)
            ju = tuple(a + b * 1j for a, b in zip(ju, jv))
        for j, (o, v) in enumerate(zip(outputs, all_v)):
            n = _dot(v, ju[keep[j]])
            vj = [_vjp(o, diff, v.reshape(o._data.shape))[i] for _ in range(2)]
            vj = [torch.zeros(data.numel(), dtype=data.dtype) if g is None else g._data.reshape(-1) for g in vj]
            if float((vj[0] - vj[1]).abs().max() if vj[0].numel() else 0) > nondet_tol:
                raise GradcheckError("Backward is not reentrant, i.e., running backward with same input and "
                                     "grad_output multiple times gives different values, although analytical "
                                     f"gradient matches numerical gradient.The tolerance for nondeterminism was "
                                     f"{nondet_tol}.")
            a = _dot_u(vj[0], u)
            tol = atol * (float(u[0].sum()) + float(u[1].sum()) if isinstance(u, tuple) else float(u.sum())) \
                * float(v.sum())
            if not _allclose(a, n, rtol, tol):
                slow = _analytical(o, [x], float("inf"), False)[0]
                slow_n = _numerical(func, inputs, eps)[i][keep[j]]
                raise GradcheckError(
                    _mismatch(a, n, j, i, complex_outs, imag)
                    + "\nThe above quantities relating the numerical and analytical jacobians are computed \n"
                      "in fast mode. Below, we recompute numerical and analytical jacobians in slow mode:\n\n"
                      f"Numerical:\n {slow_n}\nAnalytical:\n{slow}\n\n"
                      f"The max per-element difference (slow mode) is: {(slow_n - slow).abs().max()}.\n")


def _real_dtype(dt: torch.dtype) -> torch.dtype:
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dt, dt)


def _unit(n: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    vec = torch.rand(n, generator=gen).to(dtype=dtype)
    return vec / vec.norm()


def _dot(v: torch.Tensor, ju: torch.Tensor) -> torch.Tensor:
    dt = torch.promote_types(v.dtype, ju.dtype)
    return v.to(dt).dot(ju.to(dt))


def _dot_u(vj: torch.Tensor, u) -> torch.Tensor:
    if vj.is_complex():   # C -> R
        tv = torch.view_as_real(vj.resolve_conj())
        return tv.select(-1, 0).dot(u[0]) + 1j * tv.select(-1, 1).dot(u[1])
    return vj.dot(u)


# -- the other checks ------------------------------------------------------------------------------

def _mul_by_grad_output(outputs: tuple, inputs: tuple) -> None:
    diff = _diff_inputs(inputs)
    zeros = [Tensor._make(torch.zeros_like(o._data)) for o in outputs]
    for g, x in zip(_grad(outputs, diff, zeros, retain_graph=True, allow_unused=True), diff):
        if g is None:
            continue
        if not bool(g._data.eq(0).all()):
            raise GradcheckError("backward not multiplied by grad_output")
        if g._data.dtype != x._data.dtype:
            raise GradcheckError("grad is incorrect type")
        if g._data.device != x._data.device:
            raise GradcheckError("grad is incorrect device")
        if tuple(g.shape) != tuple(x.shape):
            raise GradcheckError("grad is incorrect size")


def _undefined_grads(func, inputs: tuple) -> None:
    """Backward with every output's gradient undefined (holoflow: None, what the engine hands a
    rule for an output nothing reached), then with one undefined at a time and zeros elsewhere:
    each input's gradient must be undefined or zero."""
    diff = _diff_inputs(inputs)
    outs = _differentiable(func(*inputs))
    cases = [[None] * len(outs)]
    if len(outs) > 1:
        cases += [[None if k == i else Tensor._make(torch.zeros_like(o._data)) for k, o in enumerate(outs)]
                  for i in range(len(outs))]
    for grads in cases:
        outs = _differentiable(func(*inputs))
        try:
            got = run_backward(list(outs), grads, False, False, capture=diff, accumulate=False)
        except RuntimeError as e:
            raise GradcheckError('Expected backward function to handle undefined output grads. Please look at '
                                 '"Notes about undefined output gradients" in "tools/autograd/derivatives.yaml"') from e
        for g in got:
            if g is not None and not bool(g._data.eq(0).all()):
                raise GradcheckError('Expected all input grads to be undefined or zero when all output grads are '
                                     'undefined or zero. Please look at "Notes about undefined output gradients" in '
                                     '"tools/autograd/derivatives.yaml"')


def _batched(inputs: tuple, output: Tensor, output_idx: int) -> None:
    """``autograd.grad(is_grads_batched=True)`` against one vjp per grad_output."""
    diff = _diff_inputs(inputs)
    d = output._data   # (randn_like's draws, from a simulated rank's own generator on its thread)
    gos = [torch.empty_like(d).normal_(generator=generators.for_kernel(None, d.device)) for _ in range(2)]

    def vjp(v):
        return [g._data if g is not None else torch.zeros_like(x._data)
                for g, x in zip(_grad(output, diff, Tensor._make(v), retain_graph=True, allow_unused=True), diff)]
    expected = [torch.stack(s) for s in zip(*[vjp(v) for v in gos])]
    try:
        got = _grad(output, diff, Tensor._make(torch.stack(gos)), retain_graph=True, allow_unused=True,
                    is_grads_batched=True)
    except RuntimeError as ex:
        raise GradcheckError(f"While computing batched gradients, got: {ex}") from ex
    for i, (r, e) in enumerate(zip(got, expected)):
        r = torch.zeros_like(e) if r is None else r._data
        if not torch.allclose(r, e):
            raise GradcheckError(f"For output {output_idx} and input {i}:\n\ngradcheck or gradgradcheck failed "
                                 f"while testing batched gradient computation.\n\nGot:\n{r}\n\nExpected:\n{e}")


def gradgradcheck(func: Callable[..., Tensor | Sequence[Tensor]], inputs: Tensor | Sequence[Tensor],
                  grad_outputs: Tensor | Sequence[Tensor | None] | None = None, *, eps: float = 1e-6,
                  atol: float = 1e-5, rtol: float = 1e-3, gen_non_contig_grad_outputs: bool = False,
                  raise_exception: bool = True, nondet_tol: float = 0.0, check_undefined_grad: bool = True,
                  check_grad_dtypes: bool = False, check_batched_grad: bool = False,
                  check_fwd_over_rev: bool = False, check_rev_over_rev: bool = True, fast_mode: bool = False,
                  masked: bool = False) -> bool:
    """Checks the gradients of ``func``'s gradients (to ``grad_outputs``, random ones if None)
    with :func:`gradcheck`, over the inputs and the grad_outputs that require grad."""
    if not (check_fwd_over_rev or check_rev_over_rev):
        raise AssertionError(_PREFIX + "Expected at least one of check_fwd_over_rev or check_rev_over_rev to be True")
    if check_undefined_grad and not check_rev_over_rev:
        raise AssertionError(_PREFIX + "Setting check_undefined_grad=True requires check_rev_over_rev to be True")
    if check_batched_grad and not check_rev_over_rev:
        raise AssertionError(_PREFIX + "Setting check_batched_grad=True requires check_rev_over_rev to be True")
    tupled_inputs = _as_tuple(inputs)
    if grad_outputs is None:   # as torch.testing.make_tensor: uniform in [-1, 1), requiring grad
        outs = _differentiable(func(*tupled_inputs))
        tupled_grad_outputs = tuple(_random_like(o, gen_non_contig_grad_outputs) for o in outs)
    else:
        tupled_grad_outputs = _as_tuple(grad_outputs)
    n_out = len(tupled_grad_outputs)
    diff_in = {i for i, x in enumerate(tupled_inputs) if isinstance(x, Tensor) and x.requires_grad}
    diff_go = {i for i, x in enumerate(tupled_grad_outputs) if x.requires_grad}

    def new_func(*args):
        ins = tuple(x.requires_grad_() if i in diff_in else x for i, x in enumerate(args[:-n_out]))
        outs = _differentiable(func(*ins))
        gos = tuple(x.requires_grad_() if i in diff_go else x for i, x in enumerate(args[-n_out:]))
        grads = _grad(outs, tuple(x for i, x in enumerate(ins) if i in diff_in), gos, create_graph=True,
                      allow_unused=True)
        return tuple(g for g in grads if g is not None)
    return gradcheck(new_func, tupled_inputs + tupled_grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, nondet_tol=nondet_tol, check_undefined_grad=check_undefined_grad,
                     check_grad_dtypes=check_grad_dtypes, check_batched_grad=check_batched_grad, fast_mode=fast_mode,
                     check_forward_ad=check_fwd_over_rev, check_backward_ad=check_rev_over_rev, masked=masked)


def _random_like(o: Tensor, noncontiguous: bool) -> Tensor:
    d = o._data
    dt = d.dtype if d.is_floating_point() or d.is_complex() else torch.float64
    r = torch.testing.make_tensor(d.shape, dtype=dt, device=d.device, low=-1, high=1, noncontiguous=noncontiguous)
    return Tensor._make(r).requires_grad_(True)
