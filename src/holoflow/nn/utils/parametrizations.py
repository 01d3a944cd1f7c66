"""``holoflow.nn.utils.parametrizations``: ``weight_norm``, ``spectral_norm`` and ``orthogonal``
as parametrizations (torch's current API; the state-dict keys are
``parametrizations.weight.original0/1``, ``parametrizations.weight.original`` +
``parametrizations.weight.0._u/_v``, and ``parametrizations.weight.original`` +
``parametrizations.weight.0.base``)."""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from ...core.grad_mode import no_grad
from ...core.tensor import Tensor
from ...ops.creation import empty, eye, randn
from ...ops.layout import tril
from ...ops.linalg import matrix_exp
from ...ops.linalg_solve import householder_product, solve
from ...ops.lowrank import norm_except_dim
from ...ops.reduction import vector_norm
from ...ops.shape import cat
from .. import init
from ..module import Module
from .parametrize import register_parametrization

__all__ = ["weight_norm", "spectral_norm", "orthogonal"]


def normalize(x: Tensor, dim: int = 0, eps: float = 1e-12) -> Tensor:
    """``x / max(||x||_2, eps)`` with the 2-norm kernel ``F.normalize`` uses (bitwise torch's)."""
    return x / vector_norm(x, 2, dim, keepdim=True).clamp_min(eps)


class _WeightNorm(Module):
    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        return weight_v * (weight_g / norm_except_dim(weight_v, 2, self.dim))

    def right_inverse(self, weight: Tensor) -> tuple[Tensor, Tensor]:
        return norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """``module.<name> = g * v / ||v||`` with magnitude ``original0`` (g) and direction
    ``original1`` (v), norms over every dim but ``dim`` (None: the whole tensor). As torch's, a
    state dict of the old ``nn.utils.weight_norm`` (``<name>_g``, ``<name>_v``) loads into it."""
    register_parametrization(module, name, _WeightNorm(dim), unsafe=True)

    def _old_keys(state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
        g, v = f"{prefix}{name}_g", f"{prefix}{name}_v"
        if g in state_dict and v in state_dict:
            state_dict[f"{prefix}parametrizations.{name}.original0"] = state_dict.pop(g)
            state_dict[f"{prefix}parametrizations.{name}.original1"] = state_dict.pop(v)

    module._register_load_state_dict_pre_hook(_old_keys)   # (kept after removal, as torch's)
    return module


class _SpectralNorm(Module):
    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        super().__init__()
        ndim = weight.dim()
        if dim >= ndim or dim < -ndim:
            raise IndexError("Dimension out of range (expected to be in range of "
                             f"[-{ndim}, {ndim - 1}] but got {dim})")
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            mat = self._reshape_weight_to_matrix(weight.detach())
            h, w = mat.shape
            u = init.normal_(empty(h, dtype=mat.dtype, device=mat.device), 0.0, 1.0)
            v = init.normal_(empty(w, dtype=mat.dtype, device=mat.device), 0.0, 1.0)
            self.register_buffer("_u", normalize(u, dim=0, eps=self.eps))
            self.register_buffer("_v", normalize(v, dim=0, eps=self.eps))
            self._power_method(mat, 15)

    def _reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
        if self.dim != 0:
            weight = weight.permute(self.dim, *(d for d in range(weight.dim()) if d != self.dim))
        return weight.flatten(1)

    def _power_method(self, mat: Tensor, n: int) -> None:
        """``n`` power-iteration steps updating the ``_u``/``_v`` buffers in place: a no-grad
        buffer update like an initialiser (nn/init.py), so it runs torch's own ``mv`` and
        ``normalize`` calls on the storages and the estimates stay bitwise torch's."""
        with no_grad():
            w, u, v = mat.detach()._data, self._u._data, self._v._data
            for _ in range(n):
                u.copy_(TF.normalize(torch.mv(w, v), dim=0, eps=self.eps))
                v.copy_(TF.normalize(torch.mv(w.H, u), dim=0, eps=self.eps))

    def forward(self, weight: Tensor) -> Tensor:
        if weight.dim() == 1:
            return normalize(weight, dim=0, eps=self.eps)
        mat = self._reshape_weight_to_matrix(weight)
        if self.training:
            self._power_method(mat, self.n_power_iterations)
        u, v = self._u.clone(), self._v.clone()
        sigma = (u * (mat @ v)).sum()
        return weight / sigma

    def right_inverse(self, value: Tensor) -> Tensor:
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
    """``module.<name> / sigma``, ``sigma`` its largest singular value estimated by power
    iteration (one step per training forward; 15 at registration), as torch's."""
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        dim = 1 if type(module).__name__ in ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d") else 0
    return register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))


_ORTHOGONAL_MAPS = ("matrix_exp", "cayley", "householder")


def _is_orthogonal(Q: torch.Tensor) -> bool:
    """Whether the columns of the tall ``Q`` are orthonormal, to torch's tolerance."""
    n, k = Q.size(-2), Q.size(-1)
    eye_k = torch.eye(k, dtype=Q.dtype, device=Q.device)
    return torch.allclose(Q.mH @ Q, eye_k, atol=10.0 * n * torch.finfo(Q.dtype).eps)


def _make_orthogonal(A: torch.Tensor) -> torch.Tensor:
    """The Q of ``A = QR`` (``A`` tall) with ``diag(R)`` real and non-negative, so Q is unique."""
    X, tau = torch.geqrf(A)
    Q = torch.linalg.householder_product(X, tau)
    return Q * X.diagonal(dim1=-2, dim2=-1).sgn().unsqueeze(-2)


class _Orthogonal(Module):
    """``Q = map(X)`` orthogonal (unitary), for the tall orientation of ``X``; with the dynamic
    trivialization ``Q = base @ map(X)``, ``base`` the buffer ``right_inverse`` sets.

    - ``matrix_exp`` / ``cayley``: ``A = L - L^H`` from the lower triangle ``L`` of ``X``
      (zero-padded to square), ``Q = exp(A)`` or ``(I - A/2)^{-1} (I + A/2)``, first ``k`` columns;
    - ``householder``: the reflectors below the diagonal of ``X``, ``tau = 2 / (1 + |v|^2)``,
      columns signed by ``X``'s diagonal (+-1, not differentiated).
    """

    def __init__(self, weight: Tensor, orthogonal_map: str, *, use_trivialization: bool = True) -> None:
        super().__init__()
        if weight.is_complex() and orthogonal_map == "householder":
            # complex reflectors below the diagonal have too few real parameters for a unitary
            raise ValueError("The householder parametrization does not support complex tensors.")
        self.shape = tuple(weight.shape)
        self.orthogonal_map = orthogonal_map
        if use_trivialization:
            self.register_buffer("base", None)

    def forward(self, X: Tensor) -> Tensor:
        n, k = X.size(-2), X.size(-1)
        transposed = n < k
        if transposed:
            X = X.mT
            n, k = k, n
        if self.orthogonal_map in ("matrix_exp", "cayley"):
            X = tril(X)
            if n != k:   # embed into a square matrix
                X = cat([X, X.new_zeros(n, n - k).expand(*X.shape[:-2], -1, -1)], dim=-1)
            A = X - X.mH   # skew-symmetric (skew-hermitian)
            if self.orthogonal_map == "matrix_exp":
                Q = matrix_exp(A)
            else:        # the Cayley retraction (I + A/2)(I - A/2)^{-1}
                Id = eye(n, dtype=A.dtype, device=A.device)
                Q = solve(Id.add(A, alpha=-0.5), Id.add(A, alpha=0.5))
            if n != k:
                Q = Q[..., :k]
        else:
            A = tril(X, -1)
            tau = 2.0 / (1.0 + (A * A).sum(dim=-2))
            Q = householder_product(A, tau)
            Q = Q * X.diagonal(dim1=-2, dim2=-1).int().unsqueeze(-2)
        if "base" in self._buffers:
            Q = self.base @ Q
        if transposed:
            Q = Q.mT
        return Q

    def right_inverse(self, Q: Tensor) -> Tensor:
        """The original tensor that gives ``Q``: with the trivialization, ``base`` becomes ``Q``
        (orthogonalized by QR when it is not orthogonal; completed with random columns when not
        square) and the original is ``-I``, which every map sends to ``I``; without it, only the
        householder map can be inverted (its QR reflectors). A no-grad initialisation, so it runs
        torch's own ``geqrf``/QR calls on the storages, and the results are bitwise torch's."""
        if tuple(Q.shape) != self.shape:
            raise ValueError(f"Expected a matrix or batch of matrices of shape {torch.Size(self.shape)}. "
                             f"Got a tensor of shape {Q.shape}.")
        with no_grad():
            q = Q.detach()._data
            n, k = q.size(-2), q.size(-1)
            transpose = n < k
            if transpose:
                q = q.mT
                n, k = k, n
            if "base" not in self._buffers:
                if self.orthogonal_map in ("matrix_exp", "cayley"):
                    raise NotImplementedError("It is not possible to assign to the matrix exponential or the "
                                              "Cayley parametrizations when use_trivialization=False.")
                A, tau = torch.geqrf(q)
                # diag(R) > 0 makes the factorization unique; the diagonal of A holds its signs
                A.diagonal(dim1=-2, dim2=-1).sign_()
                A.diagonal(dim1=-2, dim2=-1)[tau == 0.0] *= -1   # LAPACK skipped that reflection
                return Tensor._make(A.mT if transpose else A)
            if n == k:
                q = q.clone() if _is_orthogonal(q) else _make_orthogonal(q)
            else:   # complete into an n x n orthogonal matrix (holoflow's generator, as torch.randn)
                extra = randn(*(q.size()[:-2] + (n, n - k)), dtype=Q.dtype, device=Q.device)._data
                q = _make_orthogonal(torch.cat([q, extra], dim=-1))
            self.base = Tensor._make(q)
            neg_id = torch.zeros(self.shape, dtype=q.dtype, device=q.device)
            neg_id.diagonal(dim1=-2, dim2=-1).fill_(-1.0)
            return Tensor._make(neg_id)


def orthogonal(module: Module, name: str = "weight", orthogonal_map: str | None = None, *,
               use_trivialization: bool = True) -> Module:
    """Makes ``module.<name>`` (a matrix, or a batch of them) orthogonal (unitary), as
    ``torch.nn.utils.parametrizations.orthogonal``: orthonormal columns when it is tall, rows
    when wide. ``orthogonal_map`` is ``"matrix_exp"``, ``"cayley"`` or ``"householder"``
    (default: matrix_exp for square or complex matrices, householder otherwise).
    ``use_trivialization=True`` keeps ``base`` (``module.parametrizations.<name>[0].base``) so
    the initial value is the tensor itself (orthogonalized by QR if needed)."""
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if weight.dim() < 2:
        raise ValueError(f"Expected a matrix or batch of matrices. Got a tensor of {weight.dim()} dimensions.")
    if orthogonal_map is None:
        square = weight.size(-2) == weight.size(-1)
        orthogonal_map = "matrix_exp" if square or weight.is_complex() else "householder"
    if orthogonal_map not in _ORTHOGONAL_MAPS:
        raise ValueError('orthogonal_map has to be one of "matrix_exp", "cayley", "householder". '
                         f"Got: {orthogonal_map}")
    orth = _Orthogonal(weight, orthogonal_map, use_trivialization=use_trivialization)
    return register_parametrization(module, name, orth, unsafe=True)
