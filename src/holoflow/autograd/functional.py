"""``holoflow.autograd.functional``: torch.autograd.functional's ``vjp``, ``jvp``, ``jacobian``,
``hessian``, ``vhp`` and ``hvp`` on holoflow's tape autograd.

Each records ``func`` on fresh copies of the inputs and runs ``autograd.grad``, following torch's
conventions exactly: a tuple of inputs (or outputs) gives a tuple of results, a single tensor a
single tensor; ``strict=True`` raises where an output does not depend on an input;
``create_graph=True`` keeps the results differentiable with respect to the caller's inputs.
There is no forward-mode AD here: ``jvp`` and ``hvp`` use the double-backward trick, as torch's
do, and ``strategy="forward-mode"`` (accepted where torch accepts it) computes the same Jacobian
by reverse mode. ``vectorize=True`` gives the same values as the loop over output elements.
"""
from __future__ import annotations

from typing import Callable

from ..core import grad_mode
from ..core.tensor import Tensor, refuse_requires_grad_in_transform, wrapped_without_grad
from ..ops.creation import zeros_like
from ..ops.shape import stack
from . import grad as _grad

__all__ = ["vjp", "jvp", "jacobian", "hessian", "vhp", "hvp"]

Tensors = Tensor | tuple


def _as_tuple(x, arg_name: str, fn_name: str) -> tuple[bool, tuple]:
    """``(was a tuple, the tensors as a tuple)``; anything but tensors is a TypeError."""
    is_tuple = isinstance(x, tuple)
    xs = x if is_tuple else (x,)
    for i, el in enumerate(xs):
        if not isinstance(el, Tensor):
            where = f"the value at index {i}" if is_tuple else f"the given {arg_name}"
            raise TypeError(f"The {arg_name} given to {fn_name} must be either a Tensor or a tuple of "
                            f"Tensors but {where} has type {type(el)}.")
    return is_tuple, xs


def _check_outputs(outs: tuple, strict: bool) -> None:
    for i, o in enumerate(outs):
        if strict and not o.requires_grad:
            raise RuntimeError(f"Output {i} of the user-provided function does not require gradients. The "
                               f"outputs must be computed in a differentiable manner from the input when "
                               f"running in strict mode.")


def _outputs(func: Callable, inputs: tuple, fn_name: str, strict: bool) -> tuple[bool, tuple]:
    is_tuple, outs = _as_tuple(func(*inputs), "outputs of the user-provided function", fn_name)
    _check_outputs(outs, strict)
    return is_tuple, outs


def _preprocess(xs: tuple, create_graph: bool, need_graph: bool) -> tuple:
    """Fresh tensors to differentiate with respect to: a view of a recorded input when the result
    must stay differentiable with respect to it (``create_graph``), a detached copy otherwise,
    made to require grad as torch's does, with ``requires_grad_()``, which torch.func's transforms
    refuse inside the functions they transform (where an input requires grad as they tell it)."""
    fresh = []
    for x in xs:
        if create_graph and x.requires_grad and not wrapped_without_grad(x):
            fresh.append(x.view_as(x))
            continue
        if grad_mode.STATE.level > 0:
            refuse_requires_grad_in_transform("holoflow.autograd.functional (its requires_grad_() of the inputs)")
        fresh.append(x.detach().requires_grad_(need_graph))
    return tuple(fresh)


def _postprocess(res, create_graph: bool):
    if isinstance(res, Tensor):
        return res if create_graph else res.detach()
    return tuple(_postprocess(r, create_graph) for r in res)


def _unpack(res: tuple, is_outer_tuple: bool, is_inner_tuple: bool | None = None):
    """torch's ``_tuple_postprocess``: drop the tuple levels the caller did not pass tuples for."""
    if is_inner_tuple is not None and not is_inner_tuple:
        res = tuple(r[0] for r in res)
    return res if is_outer_tuple else res[0]


def _validate_v(v, other: tuple, is_other_tuple: bool, fn_name: str, create_graph: bool) -> tuple:
    _, v = _as_tuple(v, "v", fn_name)
    v = _preprocess(v, create_graph, need_graph=False)
    if len(v) != len(other):
        raise RuntimeError(f"v is a tuple of invalid length: should be {len(other)} but got {len(v)}."
                           if is_other_tuple else "The given v should contain a single Tensor.")
    for i, (a, b) in enumerate(zip(v, other)):
        if a.size() != b.size():
            prefix = f"Entry {i} in " if is_other_tuple else ""
            raise RuntimeError(f"{prefix}v has invalid size: should be {b.size()} but got {a.size()}.")
    return v


def _need_v(xs: tuple, what: str) -> None:
    if len(xs) != 1 or xs[0].nelement() != 1:
        raise RuntimeError(f"The vector v can only be None if {what} a single Tensor with a single element.")


def _autograd_grad(outputs: tuple, inputs: tuple, grad_outputs: tuple | None = None,
                   create_graph: bool = False, retain_graph: bool | None = None) -> tuple:
    """``autograd.grad`` over the outputs that require grad (None for every input if none does)."""
    gos = grad_outputs if grad_outputs is not None else (None,) * len(outputs)
    live = [(o, g) for o, g in zip(outputs, gos) if o is not None and o.requires_grad]
    if not live:
        return (None,) * len(inputs)
    return _grad([o for o, _ in live], list(inputs), [g for _, g in live], retain_graph=retain_graph,
                 create_graph=create_graph, allow_unused=True)


_INDEPENDENT = {
    "back": "The output of the user-provided function is independent of input {i}. This is not allowed in "
            "strict mode.",
    "back_trick": "The gradient with respect to the input is independent of entry {i} in the grad_outputs "
                  "when using the double backward trick to compute forward mode gradients. This is not "
                  "allowed in strict mode.",
    "double_back": "The jacobian of the user-provided function is independent of input {i}. This is not "
                   "allowed in strict mode.",
    "double_back_trick": "The hessian of the user-provided function is independent of entry {i} in the "
                         "grad_jacobian. This is not allowed in strict mode as it prevents from using the "
                         "double backward trick to replace forward mode AD.",
}


def _fill_in_zeros(grads: tuple, refs: tuple, strict: bool, create_graph: bool, stage: str) -> tuple:
    """Zeros where an input was unused; under ``strict`` that (or, with ``create_graph``, a result
    that does not depend on the inputs) is an error."""
    res = []
    for i, (g, ref) in enumerate(zip(grads, refs)):
        if g is None:
            if strict:
                raise RuntimeError(_INDEPENDENT[stage].format(i=i))
            g = zeros_like(ref)
        elif strict and create_graph and not g.requires_grad:
            what = "hessian" if "double" in stage else "jacobian"
            raise RuntimeError(f"The {what} of the user-provided function is independent of input {i}. This "
                               f"is not allowed in strict mode when create_graph=True.")
        res.append(g)
    return tuple(res)


def _check_grads_require_grad(grads: tuple, kind: str, strict: bool) -> None:
    """strict mode: the first derivatives must themselves be differentiable (for jvp's and the
    Hessian's second backward pass)."""
    if not strict:
        return
    for i, g in enumerate(grads):
        if g is None:
            raise RuntimeError(f"The output of the user-provided function is independent of input {i}. "
                               f"This is not allowed in strict mode.")
        if not g.requires_grad:
            if kind == "grad_inputs":
                raise RuntimeError(f"The gradient with respect to input {i} is independent of the inputs of "
                                   f"the user-provided function. This is not allowed in strict mode.")
            if kind == "hessian":
                raise RuntimeError(f"The hessian of the user-provided function with respect to input {i} is "
                                   f"independent of the input. This is not allowed in strict mode. You should "
                                   f"ensure that your function is thrice differentiable and that the hessian "
                                   f"depends on the inputs.")
            raise RuntimeError(f"While computing the hessian, found that the jacobian of the user-provided "
                               f"function with respect to input {i} is independent of the input. This is not "
                               f"allowed in strict mode. You should ensure that your function is twice "
                               f"differentiable and that the jacobian depends on the inputs (this would be "
                               f"violated by a linear function for example).")


def vjp(func: Callable, inputs: Tensors, v: Tensors | None = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """``(func(inputs), v^T J)``: the vector-Jacobian product at ``inputs``."""
    with grad_mode.enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "vjp")
        inputs = _preprocess(inputs, create_graph, need_graph=True)
        is_outputs_tuple, outputs = _outputs(func, inputs, "vjp", strict)
        if v is not None:
            v = _validate_v(v, outputs, is_outputs_tuple, "vjp", create_graph)
        else:
            _need_v(outputs, "the user-provided function returns")
    with grad_mode.set_grad_enabled(create_graph or grad_mode.is_grad_enabled()):
        res = _fill_in_zeros(_autograd_grad(outputs, inputs, v, create_graph), inputs, strict, create_graph,
                             "back")
    return (_unpack(_postprocess(outputs, create_graph), is_outputs_tuple),
            _unpack(_postprocess(res, create_graph), is_inputs_tuple))


def jvp(func: Callable, inputs: Tensors, v: Tensors | None = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """``(func(inputs), J v)``: the Jacobian-vector product, by the double-backward trick (the vjp
    with a symbolic cotangent ``u`` is linear in ``u``; its vjp against ``v`` is ``J v``)."""
    with grad_mode.enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jvp")
        inputs = _preprocess(inputs, create_graph, need_graph=True)
        if v is not None:
            v = _validate_v(v, inputs, is_inputs_tuple, "jvp", create_graph)
        else:
            _need_v(inputs, "the input to the user-provided function is")
        is_outputs_tuple, outputs = _outputs(func, inputs, "jvp", strict)
        us = tuple(zeros_like(o).requires_grad_(True) for o in outputs)
        grad_inputs = _autograd_grad(outputs, inputs, us, create_graph=True)
        _check_grads_require_grad(grad_inputs, "grad_inputs", strict)
    with grad_mode.set_grad_enabled(create_graph or grad_mode.is_grad_enabled()):
        res = _fill_in_zeros(_autograd_grad(grad_inputs, us, v, create_graph), outputs, strict, create_graph,
                             "back_trick")
    return (_unpack(_postprocess(outputs, create_graph), is_outputs_tuple),
            _unpack(_postprocess(res, create_graph), is_outputs_tuple))


def jacobian(func: Callable, inputs: Tensors, create_graph: bool = False, strict: bool = False,
             vectorize: bool = False, strategy: str = "reverse-mode"):
    """The Jacobian of ``func`` at ``inputs``: for output ``i`` and input ``j`` a tensor of shape
    ``out_i.shape + in_j.shape``, nested ``[i][j]`` where outputs / inputs were tuples. One vjp per
    output element (``vectorize`` and ``strategy`` change how torch computes it, not the values)."""
    if strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError('Expected strategy to be either "forward-mode" or "reverse-mode". Hint: If your '
                             'function has more outputs than inputs, "forward-mode" tends to be more '
                             'performant. Otherwise, prefer to use "reverse-mode".')
    if strategy == "forward-mode":
        if create_graph:
            raise NotImplementedError('torch.autograd.functional.jacobian: `create_graph=True` and '
                                      '`strategy="forward-mode"` are not supported together (yet). Please '
                                      'either set `create_graph=False` or `strategy="reverse-mode"`.')
        if strict:
            raise RuntimeError('torch.autograd.functional.jacobian: `strict=True` and `strategy="forward-mode"` '
                               'are not supported together (yet). Please either set `strict=False` or '
                               '`strategy="reverse-mode"`.')
        if not vectorize:
            raise NotImplementedError("Computing Jacobian using forward-AD or forward-over-reverse Hessian is "
                                      "only implemented for `vectorize=True`.")
    if vectorize and strict:
        raise RuntimeError("torch.autograd.functional.jacobian: `strict=True` and `vectorized=True` are not "
                           "supported together. Please either set `strict=False` or `vectorize=False`.")
    with grad_mode.enable_grad():
        is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "jacobian")
        inputs = _preprocess(inputs, create_graph, need_graph=True)
        is_outputs_tuple, outputs = _outputs(func, inputs, "jacobian", strict)
        jac = []
        for i, out in enumerate(outputs):
            flat = out.reshape(-1)
            rows: list[list] = [[] for _ in inputs]
            for k in range(out.nelement()):
                vj = _autograd_grad((flat[k],), inputs, retain_graph=True, create_graph=create_graph)
                for j, (g, inp) in enumerate(zip(vj, inputs)):
                    if g is None:
                        if strict:
                            raise RuntimeError(f"Output {i} of the user-provided function is independent of "
                                               f"input {j}. This is not allowed in strict mode.")
                        g = zeros_like(inp)
                    elif strict and create_graph and not g.requires_grad:
                        raise RuntimeError(f"The jacobian of the user-provided function is independent of "
                                           f"input {i}. This is not allowed in strict mode when create_graph=True.")
                    rows[j].append(g)
            jac.append(tuple(stack(r).reshape(tuple(out.shape) + tuple(inp.shape)) for r, inp in zip(rows, inputs)))
    jac = _postprocess(tuple(jac), create_graph)
    if strategy == "forward-mode":   # torch's forward mode nests lists where its reverse mode nests tuples
        jac = [list(r) for r in jac]
    return _unpack(jac, is_outputs_tuple, is_inputs_tuple)


def hessian(func: Callable, inputs: Tensors, create_graph: bool = False, strict: bool = False,
            vectorize: bool = False, outer_jacobian_strategy: str = "reverse-mode"):
    """The Hessian of a function returning one element: the Jacobian of its Jacobian, nested
    ``[i][j]`` over the inputs where they were a tuple."""
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", "hessian")
    if outer_jacobian_strategy not in ("forward-mode", "reverse-mode"):
        raise AssertionError('Expected strategy to be either "forward-mode" or "reverse-mode".')

    def single_output(*inp):
        out = func(*inp)
        is_out_tuple, outs = _as_tuple(out, "outputs of the user-provided function", "hessian")
        _check_outputs(outs, strict)
        if is_out_tuple:
            raise RuntimeError("The function given to hessian should return a single Tensor")
        if out.nelement() != 1:
            raise RuntimeError("The Tensor returned by the function given to hessian should contain a single "
                               "element")
        return out.squeeze()

    def jac_func(*inp):
        jac = jacobian(single_output, inp, create_graph=True)
        _check_grads_require_grad(jac, "jacobian", strict)
        return jac

    res = jacobian(jac_func, inputs, create_graph=create_graph, strict=strict, vectorize=vectorize,
                   strategy=outer_jacobian_strategy)
    return _unpack(res, is_inputs_tuple, is_inputs_tuple)


def _scalar_outputs(func: Callable, inputs: tuple, fn_name: str, strict: bool) -> tuple:
    is_outputs_tuple, outputs = _outputs(func, inputs, fn_name, strict)
    if is_outputs_tuple:
        raise RuntimeError(f"The function given to {fn_name} should return a single Tensor")
    if outputs[0].nelement() != 1:
        raise RuntimeError(f"The Tensor returned by the function given to {fn_name} should contain a single "
                           f"element")
    return outputs


def _first_derivative(func: Callable, inputs: Tensors, v, create_graph: bool, strict: bool, who: str) -> tuple:
    """What ``vhp`` and ``hvp`` start from (grad mode on): the checked inputs and ``v``, the
    function's one-element output, and its gradient recorded for a second derivative."""
    is_inputs_tuple, inputs = _as_tuple(inputs, "inputs", who)
    inputs = _preprocess(inputs, create_graph, need_graph=True)
    if v is not None:
        v = _validate_v(v, inputs, is_inputs_tuple, who, create_graph)
    else:
        _need_v(inputs, "the input to the user-provided function is")
    outputs = _scalar_outputs(func, inputs, who, strict)
    jac = _autograd_grad(outputs, inputs, create_graph=True)
    _check_grads_require_grad(jac, "jacobian", strict)
    return is_inputs_tuple, inputs, v, outputs, jac


def vhp(func: Callable, inputs: Tensors, v: Tensors | None = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """``(func(inputs), v^T H)`` for a function returning one element."""
    with grad_mode.enable_grad():
        is_inputs_tuple, inputs, v, outputs, jac = _first_derivative(func, inputs, v, create_graph, strict, "vhp")
    with grad_mode.set_grad_enabled(create_graph or grad_mode.is_grad_enabled()):
        res = _fill_in_zeros(_autograd_grad(jac, inputs, v, create_graph), inputs, strict, create_graph,
                             "double_back")
    return _postprocess(outputs, create_graph)[0], _unpack(_postprocess(res, create_graph), is_inputs_tuple)


def hvp(func: Callable, inputs: Tensors, v: Tensors | None = None, create_graph: bool = False,
        strict: bool = False) -> tuple:
    """``(func(inputs), H v)`` for a function returning one element, by the double-backward trick
    (as torch computes it; for twice-differentiable functions it equals ``vhp``)."""
    with grad_mode.enable_grad():
        is_inputs_tuple, inputs, v, outputs, jac = _first_derivative(func, inputs, v, create_graph, strict, "hvp")
        us = tuple(zeros_like(x).requires_grad_(True) for x in inputs)
        double_back = _autograd_grad(jac, inputs, us, create_graph=True)
        _check_grads_require_grad(jac, "hessian", strict)
    with grad_mode.set_grad_enabled(create_graph or grad_mode.is_grad_enabled()):
        res = _fill_in_zeros(_autograd_grad(double_back, us, v, create_graph), inputs, strict, create_graph,
                             "double_back_trick")
    return _postprocess(outputs, create_graph)[0], _unpack(_postprocess(res, create_graph), is_inputs_tuple)
