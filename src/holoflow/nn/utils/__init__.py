"""``holoflow.nn.utils``: gradient clipping and parameter/vector conversion."""
from .clip_grad import clip_grad_norm_, clip_grad_value_, get_total_norm, clip_grads_with_norm_
from .convert import parameters_to_vector, vector_to_parameters

__all__ = ["clip_grad_norm_", "clip_grad_value_", "get_total_norm", "clip_grads_with_norm_",
           "parameters_to_vector", "vector_to_parameters"]

# issue 12: packed sequences, parametrizations, hook-based weight norm
from . import parametrizations, parametrize, prune, rnn  # noqa: E402
from .spectral_norm_hook import remove_spectral_norm, spectral_norm  # noqa: E402
from .weight_norm_hook import remove_weight_norm, weight_norm  # noqa: E402

__all__ += ["parametrizations", "parametrize", "prune", "rnn", "weight_norm", "remove_weight_norm", "spectral_norm",
            "remove_spectral_norm"]
