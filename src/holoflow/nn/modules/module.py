"""``torch.nn.modules.module``'s names: ``Module`` and the global module hooks."""
from ..module import (Module, register_module_forward_hook, register_module_forward_pre_hook,
                      register_module_full_backward_hook, register_module_full_backward_pre_hook)

__all__ = ["Module", "register_module_forward_hook", "register_module_forward_pre_hook",
           "register_module_full_backward_hook", "register_module_full_backward_pre_hook"]
