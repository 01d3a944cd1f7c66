"""``holoflow.distributions``: Normal, MultivariateNormal, LogNormal, Categorical, Bernoulli, Uniform,
Independent, MixtureSameFamily, TransformedDistribution with the ``transforms`` (Exp, Affine, Sigmoid,
Tanh, Softplus, Power, Abs, Compose) and ``constraints`` modules, and ``kl_divergence``, written in
holoflow ops (gradients flow through ``rsample``/``log_prob``/``entropy``) and drawing random numbers in
torch's order, so samples equal torch's under the same seed."""
from . import constraints, transformed_distribution, transforms
from .base import Distribution
from .bernoulli import Bernoulli
from .categorical import Categorical
from .independent import Independent
from .kl import kl_divergence, register_kl
from .log_normal import LogNormal
from .mixture_same_family import MixtureSameFamily
from .multivariate_normal import MultivariateNormal
from .normal import Normal
from .transformed_distribution import TransformedDistribution
from .transforms import (AbsTransform, AffineTransform, ComposeTransform, ExpTransform, PowerTransform,
                         SigmoidTransform, SoftplusTransform, TanhTransform, Transform)
from .uniform import Uniform

__all__ = ["Distribution", "Normal", "Categorical", "Bernoulli", "Independent", "Uniform", "MixtureSameFamily",
           "MultivariateNormal", "LogNormal", "TransformedDistribution", "Transform", "ComposeTransform",
           "ExpTransform", "AffineTransform", "SigmoidTransform", "TanhTransform", "SoftplusTransform",
           "PowerTransform", "AbsTransform", "constraints", "transforms", "transformed_distribution",
           "kl_divergence", "register_kl"]
