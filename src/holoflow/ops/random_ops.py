"""Random ops on torch's generator (so ``holoflow.manual_seed(s)`` reproduces torch's draws under
``torch.manual_seed(s)``): dropout, bernoulli, multinomial and the in-place samplers
``normal_``, ``uniform_``, ``random_``, ``exponential_``, ``bernoulli_``, ``cauchy_``,
``log_normal_``, ``geometric_``; ``poisson``, ``binomial`` and rrelu's training slopes; plus ``fill_``.

Each kernel draws exactly as torch's own CPU kernel does (dropout: ``bernoulli_(1 - p)`` on a
tensor like the input, divided by ``1 - p``), which is what makes the values match. On a simulated
rank's thread the default generator is the rank's own (core/generators.py), as each process's is.
"""
from __future__ import annotations

import torch

from ..core import generators, grad_mode
from ..core.dispatch import apply, apply_inplace, assign, check_inplace_target
from ..core.errors import ArgValueError
from ..core.registry import Meta, defop
from ..core.sbp import B, S
from ..core.tensor import Tensor
from .creation import ones_like, zeros_like
from .family import elementwise_sbp, like_first_input


def _gen(generator, like: Tensor):
    """The generator a kernel drawing like ``like`` gets: the caller's, else (eager, on a simulated
    rank) the rank's own, else None: torch's default (core/generators.py)."""
    return generators.for_op(generator, like)


def _dropout_kernel(x, p, generator=None):
    """``generator``: a global tensor's shard draws from its own (distributed/rng.py)."""
    if x.is_cuda and generator is None:  # torch's CUDA dropout is the fused native kernel
        out, mask = torch.ops.aten.native_dropout.default(x, p, True)
        return out, mask.to(x.dtype) * (1.0 / (1.0 - p))
    noise = torch.empty_like(x).bernoulli_(1 - p, generator=generator).div_(1 - p)
    return x * noise, noise


def _same_split_sbp(n_out: int):
    def rule(metas, attrs):
        tens = [m for m in metas if isinstance(m, Meta)]
        nd = len(tens[0].shape)
        return [((B,) * len(tens), (B,) * n_out)] + [((S(a),) * len(tens), (S(a),) * n_out) for a in range(nd)]
    return rule


DROPOUT = defop("dropout", _dropout_kernel, grad=lambda c, dy, _dm: (dy * c.outs[1],), save="output",
                saved_outputs=(1,),
                sbp=_same_split_sbp(2), outputs=("out", "mask"), random=True, family="random")


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes each element with probability ``p`` and scales the rest by ``1 / (1 - p)``
    (identity when not ``training``)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"holoflow.dropout: p must be in [0, 1], got {p}")
    if not isinstance(training, bool) and type(training).__name__ != "bool_":  # numpy's bool is fine
        raise TypeError(f"holoflow.dropout: training must be a bool, got {type(training).__name__} ({training!r})")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        out = input * 0.0
    else:   # (off simulated ranks no generator attr: torch's CUDA dropout stays its fused kernel)
        g = _gen(None, input)
        out = apply(DROPOUT, input, p=float(p), **({} if g is None else {"generator": g})).out
    if inplace:
        return assign(input, out, "dropout")
    return out


BERNOULLI = defop("bernoulli", lambda x, p, generator: torch.bernoulli(x, generator=generator) if p is None
                  else torch.bernoulli(x, p, generator=generator),
                  sbp=_same_split_sbp(1), random=True, differentiable=False, family="random")


def bernoulli(input: Tensor, p: float | None = None, *, generator=None) -> Tensor:
    """Draws 0/1 with probability ``input`` (or the constant ``p``) per element."""
    return apply(BERNOULLI, input, p=p, generator=_gen(generator, input))


def _multinomial_sbp(metas, attrs):
    sigs = [((B,), (B,))]
    if len(metas[0].shape) == 2:
        sigs.append(((S(0),), (S(0),)))
    return sigs


MULTINOMIAL = defop("multinomial", lambda x, num_samples, replacement, generator:
                    torch.multinomial(x, num_samples, replacement, generator=generator),
                    sbp=_multinomial_sbp, random=True, differentiable=False, family="random")


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
    """Samples ``num_samples`` class indices per row from the (unnormalized) weights ``input``."""
    if not replacement and num_samples > input.shape[-1]:
        raise ArgValueError(f"holoflow.multinomial: cannot draw {num_samples} samples without replacement from "
                            f"{input.shape[-1]} categories (input of shape {tuple(input.shape)}); pass "
                            f"replacement=True or num_samples <= {input.shape[-1]}")
    return apply(MULTINOMIAL, input, num_samples=int(num_samples), replacement=bool(replacement),
                 generator=_gen(generator, input))


# torch's kernels of poisson, binomial and rrelu's noise have no meta version: without a shape
# rule a global input would be gathered whole (the output shape would look data-dependent)
POISSON = defop("poisson", lambda x, generator: torch.poisson(x, generator=generator), sbp=_same_split_sbp(1),
                shape=like_first_input, random=True, differentiable=False, family="random")
BINOMIAL = defop("binomial", lambda count, prob, generator: torch.binomial(count, prob, generator=generator),
                 sbp=_same_split_sbp(1), shape=like_first_input, random=True, differentiable=False, family="random")


def poisson(input: Tensor, generator=None) -> Tensor:
    """A Poisson draw of rate ``input`` per element, as ``torch.poisson``."""
    return apply(POISSON, input, generator=_gen(generator, input))


def binomial(count: Tensor, prob: Tensor, generator=None) -> Tensor:
    """A Binomial(``count``, ``prob``) draw per element, as ``torch.binomial``."""
    if tuple(count.shape) != tuple(prob.shape):
        raise ArgValueError(f"holoflow.binomial: count of shape {tuple(count.shape)} and prob of shape "
                            f"{tuple(prob.shape)} must have the same shape")
    return apply(BINOMIAL, count, prob, generator=_gen(generator, count))


def _rrelu_noise_kernel(x, lower, upper, generator=None):
    """torch's CPU kernel: one double U[lower, upper) per element ``<= 0`` in row-major order (the
    bounds first rounded to the op's compute type), 1 elsewhere."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    lower, upper = (torch.tensor(b, dtype=compute).item() for b in (lower, upper))
    negative = x.contiguous() <= 0
    slopes = torch.empty(int(negative.sum()), dtype=torch.float64, device=x.device)
    slopes.uniform_(lower, upper, generator=generator)
    return torch.ones_like(x).masked_scatter_(negative, slopes.to(x.dtype))


RRELU_NOISE = defop("rrelu_noise", _rrelu_noise_kernel, sbp=_same_split_sbp(1), random=True,
                    shape=like_first_input,   # (the kernel counts values: no meta run)
                    differentiable=False, family="random")


def rrelu_noise(input: Tensor, lower: float, upper: float, generator=None) -> Tensor:
    """The slope ``rrelu`` multiplies each element by in training (random below 0, else 1)."""
    return apply(RRELU_NOISE, input, lower=float(lower), upper=float(upper), generator=_gen(generator, input))


# -- in-place samplers and fill_ --------------------------------------------------------------------

def _zero_grad(ctx, dy):
    """The gradient of an overwrite: zero for the overwritten tensor (torch's ``zeros_like``)."""
    return (zeros_like(dy) if ctx.needs_grad[0] else None,) + (None,) * (len(ctx.edges) - 1)


def _sampler(name: str, draw) -> object:
    """An in-place sampler: ``draw(t, *args)`` fills the torch tensor ``t``. The out-of-place
    kernel draws into a fresh tensor like the input, consuming the generator identically. The
    result does not depend on the old values: its gradient is zero (torch's ``zeros_like(grad)``:
    what the tensor held before gets a zero gradient, not none)."""
    return defop(name, lambda x, *rest, **attrs: draw(torch.empty_like(x), *rest, **attrs),
                 inplace_kernel=lambda x, *rest, **attrs: draw(x, *rest, **attrs),
                 grad=_zero_grad, sbp=elementwise_sbp(), random=True, family="random")


NORMAL_ = _sampler("normal_", lambda t, mean, std, generator: t.normal_(mean, std, generator=generator))
UNIFORM_ = _sampler("uniform_", lambda t, low, high, generator: t.uniform_(low, high, generator=generator))
RANDOM_ = _sampler("random_", lambda t, bounds, generator: t.random_(*bounds, generator=generator))
EXPONENTIAL_ = _sampler("exponential_", lambda t, lambd, generator: t.exponential_(lambd, generator=generator))
BERNOULLI_ = _sampler("bernoulli_", lambda t, p, generator: t.bernoulli_(p, generator=generator))
CAUCHY_ = _sampler("cauchy_", lambda t, median, sigma, generator: t.cauchy_(median, sigma, generator=generator))
LOG_NORMAL_ = _sampler("log_normal_", lambda t, mean, std, generator: t.log_normal_(mean, std, generator=generator))
GEOMETRIC_ = _sampler("geometric_", lambda t, p, generator: t.geometric_(p, generator=generator))
FILL_ = defop("fill_", lambda x, value: torch.full_like(x, value), inplace_kernel=lambda x, value: x.fill_(value),
              grad=_zero_grad, sbp=elementwise_sbp(), family="creation")


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator=None) -> Tensor:
    """Fills ``self`` with samples of N(mean, std^2)."""
    return apply_inplace(NORMAL_, self, mean=float(mean), std=float(std), generator=_gen(generator, self))


def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0, *, generator=None) -> Tensor:
    """Fills ``self`` with samples of U[a, b)."""
    return apply_inplace(UNIFORM_, self, low=float(a), high=float(b), generator=_gen(generator, self))


def random_(self: Tensor, from_: int = 0, to: int | None = None, *, generator=None, **kw) -> Tensor:
    """Fills ``self`` with integers in ``[from, to)`` (``random_(to)`` is ``[0, to)``; no bound:
    ``[0, 2^mantissa]``), as ``torch.Tensor.random_``."""
    from_ = kw.pop("from", from_)
    if kw:
        raise TypeError(f"holoflow.Tensor.random_: unexpected arguments {sorted(kw)}")
    bounds = () if (from_ == 0 and to is None) else ((from_,) if to is None else (from_, to))
    return apply_inplace(RANDOM_, self, bounds=bounds, generator=_gen(generator, self))


def exponential_(self: Tensor, lambd: float = 1.0, *, generator=None) -> Tensor:
    """Fills ``self`` with samples of Exp(lambd)."""
    return apply_inplace(EXPONENTIAL_, self, lambd=float(lambd), generator=_gen(generator, self))


def bernoulli_(self: Tensor, p=0.5, *, generator=None) -> Tensor:
    """Fills ``self`` with 0/1 draws of probability ``p`` (a number or a broadcastable tensor)."""
    return apply_inplace(BERNOULLI_, self, p, generator=_gen(generator, self))


def cauchy_(self: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator=None) -> Tensor:
    """Fills ``self`` with samples of the Cauchy distribution (location ``median``, scale ``sigma``)."""
    return apply_inplace(CAUCHY_, self, median=float(median), sigma=float(sigma), generator=_gen(generator, self))


def log_normal_(self: Tensor, mean: float = 1.0, std: float = 2.0, *, generator=None) -> Tensor:
    """Fills ``self`` with samples of exp(N(mean, std^2))."""
    return apply_inplace(LOG_NORMAL_, self, mean=float(mean), std=float(std), generator=_gen(generator, self))


def geometric_(self: Tensor, p: float, *, generator=None) -> Tensor:
    """Fills ``self`` with the number of Bernoulli(``p``) trials up to the first success (1, 2, ...)."""
    return apply_inplace(GEOMETRIC_, self, p=float(p), generator=_gen(generator, self))


def fill_(self: Tensor, value) -> Tensor:
    """Sets every element to ``value``: a number, or a 0-d tensor, which then receives the
    gradient (the sum of the filled elements' gradients) and may be global or traced."""
    if not isinstance(value, Tensor):
        return apply_inplace(FILL_, self, value=value)
    if value.dim() != 0:
        raise RuntimeError(f"holoflow.fill_: fill_ only supports 0-dimension value tensor but got tensor "
                           f"with {value.dim()} dimensions.")
    recording = grad_mode.STATE.enabled and (self.requires_grad or value.requires_grad)
    if recording:
        check_inplace_target(self, "fill")
    like = self.clone() if recording else self   # what masked_fill saves is not the overwritten tensor
    return assign(self, like.masked_fill(ones_like(like, dtype=torch.bool), value.to(self.dtype)), "fill")


def _bernoulli_method(self: Tensor, p: float | None = None, *, generator=None) -> Tensor:
    return bernoulli(self, p, generator=generator)


Tensor.normal_, Tensor.uniform_, Tensor.random_ = normal_, uniform_, random_
Tensor.exponential_, Tensor.bernoulli_, Tensor.fill_ = exponential_, bernoulli_, fill_
Tensor.cauchy_, Tensor.log_normal_, Tensor.geometric_ = cauchy_, log_normal_, geometric_
Tensor.bernoulli, Tensor.multinomial = _bernoulli_method, multinomial

__all__ = ["dropout", "bernoulli", "multinomial", "poisson", "binomial"]
