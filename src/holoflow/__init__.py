"""holoflow: OneFlow's design in Python on PyTorch's kernels. ``import holoflow as flow``."""
from __future__ import annotations

from .runtime.heap import tune_glibc_heap as _tune_glibc_heap
_tune_glibc_heap()   # before the first training step's allocations (runtime/heap.py says why)

from .core.dtype import (bfloat16, bool, cdouble, cfloat, complex64, complex128, double, dtype,  # noqa: A004
                         finfo, float, float16, float32, float64, get_default_dtype, half, iinfo,
                         int, int8, int16, int32, int64, long, promote_types, set_default_dtype,
                         short, uint8)
from .core.dtype import RARE as _RARE
from .core.device import device
from .core.grad_mode import enable_grad, inference_mode, no_grad, set_grad_enabled
from .core.grad_mode import user_grad_enabled as is_grad_enabled
from .core.tensor import Tensor, is_tensor
from .core.errors import HoloflowError
from .ops.creation import *  # noqa: F403
from .ops.creation import Generator
from .ops.elementwise import *  # noqa: F403
from .ops.elementwise import _FUNCS as _ELEMENTWISE
from .ops.shape import FUNCTION_FORMS as _SHAPE_FUNCTIONS
from .ops.conversion import clone
from .ops import methods as _methods  # binds Python operators to Tensor
from .ops._all import *  # noqa: F403
from . import autograd, linalg, sbp
from .distributed.placement import placement
from .distributed import global_dispatch as _global_dispatch  # noqa: F401  (the global interpreter)
from .distributed import global_tensor as _global_tensor
from . import nn, optim, utils, amp, mock_torch
from . import graph  # publishes nn.Graph
from . import distributed, comm, env
from .amp import autocast, get_autocast_dtype, is_autocast_enabled
from .amp.state import *  # noqa: F403  (torch's autocast state functions)
from .serialization import save, load
from . import checkpoint  # installs the sharded (global-tensor) format into save/load
from . import accelerator, backends, cuda, distributions, fft, func, hub, jit, onnx, testing, version  # torch's
from . import special  # torch.special
from .compat import *  # noqa: F403  (torch's switches, compile, _assert, LongTensor, channels_last)
from .func import vmap  # torch.vmap
from . import compiler, cpu, profiler, random  # torch.compiler, torch.cpu, torch.profiler, torch.random
from . import quasirandom  # torch.quasirandom (SobolEngine)
from . import futures  # torch.futures (Future, collect_all, wait_all)
from . import mps, mtia, xpu  # torch's other device modules (torch's own queries)
from . import multiprocessing  # torch.multiprocessing (spawn, Queue, start methods)
from . import functional, return_types, signal  # torch.functional, torch.return_types, torch.signal
from .compat_ops import *  # noqa: F403  (torch's ATen-style top-level names: ctc_loss, convolution, lstm ...)
from .foreach_ops import *  # noqa: F403  (torch._foreach_*: one op per tensor of a list)

_global_tensor.install()
from . import dtensor as _dtensor_api  # noqa: E402  (torch.distributed.tensor: DTensor methods on Tensor)
_dtensor_api.install()
from .compat import install_torch_arguments as _install_torch_arguments  # noqa: E402
globals().update(_ELEMENTWISE)
globals().update(_SHAPE_FUNCTIONS)   # (torch.reshape(x, (2, 3)): the sizes as one sequence only)
globals().update({_d.name: _d for _d in _RARE})   # holoflow.uint16, holoflow.float8_e4m3fn, ...
chalf = globals()["complex32"]   # torch's alias
# (torch's parser: axis= for dim=, and a TypeError naming a wrongly typed argument)
_install_torch_arguments(globals(), Tensor, linalg, special, fft, func, nn.functional)
__version__ = "0.1.0"


import torch as _real_torch  # noqa: E402  (bound now: mock_torch may redirect later imports)


def __getattr__(name: str):
    """A name torch has and holoflow lacks fails loudly, naming it."""
    raise AttributeError(f"holoflow has no attribute {name!r}" + (
        f": torch.{name} is not implemented in holoflow yet" if name in vars(_real_torch) else ""))
