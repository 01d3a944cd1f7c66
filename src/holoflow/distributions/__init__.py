"""``holoflow.distributions``: Normal, Categorical, Bernoulli, Uniform, Independent, MixtureSameFamily
and ``kl_divergence``, written in holoflow ops (gradients flow through ``rsample``/``log_prob``/
``entropy``) and drawing random numbers in torch's order, so samples equal torch's under the same seed."""
from .base import Distribution
from .bernoulli import Bernoulli
from .categorical import Categorical
from .independent import Independent
from .kl import kl_divergence, register_kl
from .mixture_same_family import MixtureSameFamily
from .normal import Normal
from .uniform import Uniform

__all__ = ["Distribution", "Normal", "Categorical", "Bernoulli", "Independent", "Uniform", "MixtureSameFamily",
           "kl_divergence", "register_kl"]
