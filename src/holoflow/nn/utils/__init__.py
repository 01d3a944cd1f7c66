"""``holoflow.nn.utils``: gradient clipping and parameter/vector conversion."""
from .clip_grad import clip_grad_norm, clip_grad_norm_, clip_grad_value_, get_total_norm, clip_grads_with_norm_
from .convert import parameters_to_vector, vector_to_parameters

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_",
           "parameters_to_vector", "vector_to_parameters"]

# issue 12: packed sequences, parametrizations, hook-based weight norm
from . import parametrizations, parametrize, prune, rnn  # noqa: E402
from .spectral_norm_hook import remove_spectral_norm, spectral_norm  # noqa: E402
from .weight_norm_hook import remove_weight_norm, weight_norm  # noqa: E402

__all__ += ["parametrizations", "parametrize", "prune", "rnn", "weight_norm", "remove_weight_norm", "spectral_norm",
            "remove_spectral_norm"]

# torch's module names, and BatchNorm folding, weight memory formats, skip_init, stateless calls
from . import clip_grad, convert_parameters, fusion, init, memory_format, stateless  # noqa: E402
from .fusion import fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval, fuse_linear_bn_weights  # noqa: E402
from .init import skip_init  # noqa: E402
from .memory_format import convert_conv2d_weight_memory_format, convert_conv3d_weight_memory_format  # noqa: E402

__all__ += ["clip_grad", "convert_parameters", "fusion", "init", "memory_format", "stateless", "fuse_conv_bn_eval",
            "fuse_conv_bn_weights", "fuse_linear_bn_eval", "fuse_linear_bn_weights", "skip_init",
            "convert_conv2d_weight_memory_format", "convert_conv3d_weight_memory_format"]
