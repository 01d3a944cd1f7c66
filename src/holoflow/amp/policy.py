"""Which ops autocast casts, and to what: torch.autocast's op lists, keyed by holoflow op name.

Five policies, as data:

- ``LOWER``: floating inputs are cast to the autocast dtype (bfloat16/float16) — matmuls, convs;
- ``FP32``: low-precision floating inputs are cast up to float32 — ops that need the range or
  accuracy (losses, norms, exp/log...);
- ``PROMOTE``: floating inputs are cast to the widest floating dtype among them, for ops whose
  kernels want one dtype (cat, stack, addcmul...);
- ``FP32_ATTR``: low-precision inputs stay as they are and the op gets ``dtype=float32``, the
  dtype of its result: CUDA's cross_entropy, which torch decomposes into
  ``log_softmax(x, 1, dtype=x.dtype)`` (an explicit dtype, so autocast leaves the log-probs in the
  logits' dtype) and ``nll_loss`` (on autocast's float32 list): a float32 loss of log-probs in
  the logits' dtype (ops/loss.py reads only the targets' log-probs in float32);
- ``NATIVE``: inputs stay as they are and the op gets ``autocast=<dtype>``: its kernel runs under
  ``torch.autocast`` itself. For ops whose dtypes come from the path ATen picks inside: CPU's
  recurrent layers (oneDNN's LSTM runs wholly in the low dtype; GRU's cell does its state math in
  float32, so its output is float32; an LSTM with projections keeps a float32 cell state).

The lists follow PyTorch's ``aten/src/ATen/autocast_mode.cpp`` per device type, so the same
program gets the same dtypes as under ``torch.autocast``. Names of ops holoflow doesn't declare
are harmless; holoflow-only primitives (``cross_entropy``, composite losses that torch
decomposes) are added where torch reaches the same dtype through its decomposition.
"""
from __future__ import annotations

LOWER, FP32, PROMOTE, FP32_ATTR, NATIVE = "lower", "fp32", "promote", "fp32_attr", "native"

_MATMUL_CONV = """
conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution
prelu addmm addbmm baddbmm bmm mm matmul linear linalg_vecdot scaled_dot_product_attention
scaled_dot_product_attention_dropout scaled_dot_product_attention_backward
scaled_dot_product_attention_fused_backward
einsum
linear_grad_input linear_grad_weight matmul_grad_a matmul_grad_b convolution_backward
"""

_CUDA_ONLY_LOWER = """
addmv addr mv chain_matmul linalg_multi_dot lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
"""

_CPU_FP32 = """
avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist trace
fake_quantize_per_tensor_affine
view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse
max_pool3d max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d
replication_pad1d replication_pad2d replication_pad3d mse_loss cosine_embedding_loss nll_loss
nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy cross_entropy_loss
cross_entropy_log_softmax
l1_loss huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss multi_margin_loss
ctc_loss kl_div multilabel_margin_loss binary_cross_entropy_with_logits binary_cross_entropy_with_logits_reduced
fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2
fft_rfftn fft_irfftn fft_hfft fft_ihfft
linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals linalg_eigvals
linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv linalg_tensorsolve
geqrf qr svd triangular_solve fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
linalg_qr linalg_cholesky_ex linalg_svd linalg_eig linalg_eigh linalg_lstsq linalg_inv_ex
"""

_CUDA_FP32 = """
acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus
layer_norm native_layer_norm group_norm frobenius_norm nuclear_norm cosine_similarity
poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss
smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits binary_cross_entropy
binary_cross_entropy_with_logits_reduced dist pdist cdist renorm logsumexp
upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_linear1d upsample_bilinear2d
upsample_trilinear3d upsample_bicubic2d interpolate
prod softmax log_softmax softmin cumprod cumsum linalg_vector_norm linalg_matrix_norm sum norm
normalize
"""

# torch's CUDA list has no cross_entropy_loss: its decomposition reaches log_softmax(x, dtype=x.dtype)
# and the float32 nll_loss
_CUDA_FP32_ATTR = "cross_entropy cross_entropy_backward cross_entropy_log_softmax"

_CPU_PROMOTE = "stack cat index_copy"
_CPU_NATIVE = """
rnn_layer lstm_layer rnn_bidi_layer lstm_bidi_layer
rnn_layer_backward lstm_layer_backward rnn_bidi_layer_backward lstm_bidi_layer_backward
"""
_CUDA_PROMOTE = """
addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add
"""

# fp32 ops that take an optional output ``dtype``: an explicit dtype wins over the cast (torch's
# ``fp32_set_opt_dtype``), so ``sum(x, dtype=bf16)`` stays what the user asked for.
OPT_DTYPE = frozenset("prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm "
                      "sum norm".split())


def _table(**lists: str) -> dict[str, str]:
    kinds = {"lower": LOWER, "fp32": FP32, "promote": PROMOTE, "fp32_attr": FP32_ATTR, "native": NATIVE}
    return {name: kinds[k] for k, names in lists.items() for name in names.split()}


def _merge(*tables: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for t in tables:
        out.update(t)
    return out


POLICIES: dict[str, dict[str, str]] = {
    "cpu": _table(lower=_MATMUL_CONV, fp32=_CPU_FP32, promote=_CPU_PROMOTE, native=_CPU_NATIVE),
    "cuda": _merge(_table(lower=_MATMUL_CONV + _CUDA_ONLY_LOWER, fp32=_CUDA_FP32, fp32_attr=_CUDA_FP32_ATTR),
                   _table(promote=_CUDA_PROMOTE + _CPU_PROMOTE)),
}

DEFAULT_DTYPE = {"cpu": "bfloat16", "cuda": "float16"}
