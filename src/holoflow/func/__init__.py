"""``holoflow.func``: torch.func's function transforms on holoflow's tape autograd.

``functional_call`` runs a module with other tensors in place of its parameters and buffers.
``grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``linearize``, ``jacrev``, ``jacfwd`` and
``hessian`` differentiate by recording the function and running ``autograd.grad``, forward mode
included (``_reverse``). ``vmap`` runs the function once per sample and stacks the results
(``_vmap``). ``stack_module_state``, ``replace_all_batch_norm_modules_``, ``functionalize`` and
``debug_unwrap`` are torch.func's helpers around them (``_modules``); ``rearrange`` is einops'
axis reordering (``_rearrange``).

Arguments and results may be nested tuples, lists and dicts of tensors, as in torch.func.
"""
from ._modules import debug_unwrap, functionalize, replace_all_batch_norm_modules_, stack_module_state
from ._rearrange import rearrange
from ._reverse import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, linearize, vjp
from ._vmap import vmap

__all__ = ["functional_call", "grad", "grad_and_value", "vjp", "jvp", "linearize", "jacrev", "jacfwd", "hessian",
           "vmap", "stack_module_state", "replace_all_batch_norm_modules_", "functionalize", "debug_unwrap",
           "rearrange"]
