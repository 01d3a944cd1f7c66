"""``holoflow.nn.attention``, as ``torch.nn.attention``: choosing the kernels of
:func:`holoflow.nn.functional.scaled_dot_product_attention`.

``sdpa_kernel(backends)`` enables only ``backends`` (``SDPBackend``, torch's enum) inside the
block: it sets torch's backend flags (``torch.backends.cuda.*_sdp_enabled``), which torch's
dispatcher reads on every device and holoflow's CPU flash path reads when the op is applied (a
graph traced inside the block keeps the choice). On the CPU, ``MATH`` runs the math attention,
``FLASH_ATTENTION`` torch's fused kernel; a block enabling neither has no viable CPU kernel
(torch's RuntimeError). The registry of flash implementations is torch's (CUDA).
``flex_attention`` (the submodule, as torch's) is the reference FlexAttention, written with ops.
"""
from __future__ import annotations

from torch.nn.attention import (WARN_FOR_UNFUSED_KERNELS, SDPBackend, activate_flash_attention_impl,
                                current_flash_attention_impl, list_flash_attention_impls,
                                register_flash_attention_impl, restore_flash_attention_impl, sdpa_kernel)

from . import bias, flex_attention

__all__ = ["SDPBackend", "sdpa_kernel", "WARN_FOR_UNFUSED_KERNELS", "register_flash_attention_impl",
           "activate_flash_attention_impl", "list_flash_attention_impls", "current_flash_attention_impl",
           "restore_flash_attention_impl", "bias", "flex_attention"]
