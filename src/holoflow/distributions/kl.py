"""``kl_divergence(p, q)`` for the pairs registered here (Normal-Normal, Bernoulli-Bernoulli,
Categorical-Categorical, Independent-Independent), as torch's formulas; another pair raises naming it."""
from __future__ import annotations

from typing import Callable

from ..core.errors import UnsupportedError
from ..core.tensor import Tensor
from .base import Distribution
from .bernoulli import Bernoulli
from .categorical import Categorical
from .independent import Independent, sum_rightmost
from .normal import Normal

__all__ = ["kl_divergence", "register_kl"]

_KL: dict[tuple[type, type], Callable] = {}


def register_kl(p_cls: type, q_cls: type) -> Callable:
    """Decorator registering ``fn(p, q)`` as KL(p || q) for the two classes."""
    def deco(fn: Callable) -> Callable:
        _KL[(p_cls, q_cls)] = fn
        return fn
    return deco


def kl_divergence(p: Distribution, q: Distribution) -> Tensor:
    """KL(p || q), batched over the distributions' batch shape."""
    fn = next((f for (a, b), f in _KL.items() if isinstance(p, a) and isinstance(q, b)), None)
    if fn is None:
        raise UnsupportedError(f"holoflow.distributions.kl_divergence: no KL for ({type(p).__name__}, "
                               f"{type(q).__name__}); registered pairs: "
                               f"{sorted((a.__name__, b.__name__) for a, b in _KL)}")
    return fn(p, q)


@register_kl(Normal, Normal)
def _kl_normal_normal(p: Normal, q: Normal) -> Tensor:
    var_ratio = (p.scale / q.scale).pow(2)
    t1 = ((p.loc - q.loc) / q.scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


@register_kl(Bernoulli, Bernoulli)
def _kl_bernoulli_bernoulli(p: Bernoulli, q: Bernoulli) -> Tensor:
    from ..nn.functional import softplus
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    return t1 + t2


@register_kl(Categorical, Categorical)
def _kl_categorical_categorical(p: Categorical, q: Categorical) -> Tensor:
    t = p.probs * (p.logits - q.logits)
    t = t.masked_fill(q.probs == 0, float("inf")).masked_fill(p.probs == 0, 0.0)
    return t.sum(-1)


@register_kl(Independent, Independent)
def _kl_independent_independent(p: Independent, q: Independent) -> Tensor:
    if p.reinterpreted_batch_ndims != q.reinterpreted_batch_ndims:
        raise NotImplementedError(f"holoflow.distributions.kl_divergence: Independent distributions with "
                                  f"different reinterpreted_batch_ndims ({p.reinterpreted_batch_ndims} vs "
                                  f"{q.reinterpreted_batch_ndims})")
    return sum_rightmost(kl_divergence(p.base_dist, q.base_dist), p.reinterpreted_batch_ndims)
