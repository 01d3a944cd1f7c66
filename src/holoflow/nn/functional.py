"""``holoflow.nn.functional``: torch.nn.functional's names over holoflow ops.

Every name is imported from the op module that defines it (nn imports ops, never the
``holoflow`` facade: docs/architecture.md, "Layers").
"""
from __future__ import annotations

from ..ops.attention import scaled_dot_product_attention
from ..ops.elementwise import sigmoid, tanh
from ..ops.layout import pad
from ..ops.linalg import linear
from ..ops.conv import (adaptive_avg_pool2d, avg_pool2d, conv1d, conv2d, conv3d, conv_transpose1d,
                        conv_transpose2d, interpolate, max_pool2d, upsample)
from ..ops.loss import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy, huber_loss,
                        kl_div, l1_loss, mse_loss, nll_loss, smooth_l1_loss, soft_margin_loss)
from ..ops.nn_ops import (cosine_similarity, elu, embedding, gelu, hardsigmoid, hardswish, hardtanh, leaky_relu,
                          log_softmax, logsigmoid, mish, normalize, one_hot, relu, relu6, relu_, rrelu, rrelu_, selu,
                          silu, softmax, softmin, softplus, threshold, threshold_)
from ..ops.activation import celu, glu, hardshrink, prelu, softshrink, softsign, tanhshrink
from ..ops.distance import pairwise_distance
from ..ops.dropout import alpha_dropout, dropout1d, dropout2d, dropout3d, feature_alpha_dropout
from ..ops.layout import pixel_shuffle, pixel_unshuffle
from ..ops.loss import cosine_embedding_loss, gaussian_nll_loss, margin_ranking_loss, poisson_nll_loss
from ..ops.norm import local_response_norm
from ..ops.pooling import adaptive_avg_pool1d, adaptive_max_pool1d, adaptive_max_pool2d, avg_pool1d, max_pool1d
from ..ops.products import bilinear
from ..ops.norm import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from ..ops.random_ops import dropout


def __getattr__(name: str):
    raise AttributeError(f"holoflow.nn.functional has no attribute {name!r} (torch.nn.functional.{name} "
                         f"is not implemented in holoflow yet)")


__all__ = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d",
           "alpha_dropout", "avg_pool1d", "avg_pool2d", "batch_norm", "bilinear", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "celu", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
           "conv_transpose2d", "cosine_embedding_loss", "cosine_similarity", "cross_entropy", "dropout", "dropout1d",
           "dropout2d", "dropout3d", "elu", "embedding", "feature_alpha_dropout", "gaussian_nll_loss", "gelu", "glu",
           "group_norm", "hardshrink", "hardsigmoid", "hardswish", "hardtanh", "huber_loss", "instance_norm",
           "interpolate", "kl_div", "l1_loss", "layer_norm", "leaky_relu", "local_response_norm", "log_softmax",
           "logsigmoid", "margin_ranking_loss", "max_pool1d", "max_pool2d", "mish", "mse_loss", "nll_loss",
           "normalize", "one_hot", "pairwise_distance", "pixel_shuffle", "pixel_unshuffle", "poisson_nll_loss",
           "prelu", "relu", "relu6", "relu_", "rms_norm", "scaled_dot_product_attention", "selu", "silu",
           "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin", "softplus", "softshrink", "softsign",
           "tanhshrink", "upsample"] + ["linear", "pad", "sigmoid", "tanh"]

# issue 12: 3-d pooling, patches, sampling, bags, CTC
from ..ops.decomp import cdist  # noqa: E402
from ..ops.pool3d import adaptive_avg_pool3d, avg_pool3d, max_pool3d  # noqa: E402
from ..ops.sampling import fold, grid_sample, unfold  # noqa: E402
from ..ops.sequence import ctc_loss, embedding_bag  # noqa: E402

__all__ += ["cdist", "adaptive_avg_pool3d", "avg_pool3d", "max_pool3d", "fold", "grid_sample", "unfold", "ctc_loss",
            "embedding_bag"]
from ..ops.distance import pdist  # noqa: E402

__all__ += ["pdist", "rrelu", "rrelu_", "threshold", "threshold_"]

from .functional_attention import multi_head_attention_forward  # noqa: E402
from ..ops.linear_loss import linear_cross_entropy  # noqa: E402
from ..ops.conv import conv_tbc  # noqa: E402
from ..ops.grouped_mm import grouped_mm  # noqa: E402

__all__ += ["multi_head_attention_forward", "linear_cross_entropy", "conv_tbc", "grouped_mm"]

# more of torch.nn.functional (nn/functional_more.py)
from . import functional_more as _more  # noqa: E402
from .functional_more import *  # noqa: E402,F401,F403

__all__ += _more.__all__
