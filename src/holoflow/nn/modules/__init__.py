"""Layers of ``holoflow.nn``, one file per family."""
from .activation import (CELU, ELU, GELU, GLU, SELU, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU,
                         LogSigmoid, LogSoftmax, Mish, PReLU, ReLU, ReLU6, Sigmoid, SiLU, Softmax,
                         Softmin, Softplus, Softsign, Tanh, Tanhshrink)
from .attention import MultiheadAttention
from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from .dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d
from .linear import Bilinear, Identity, Linear, NonDynamicallyQuantizableLinear
from .loss import (BCELoss, BCEWithLogitsLoss, CosineEmbeddingLoss, CrossEntropyLoss, GaussianNLLLoss,
                   HuberLoss, KLDivLoss, L1Loss, LinearCrossEntropyLoss, LinearCrossEntropyOptions, MarginRankingLoss,
                   MSELoss, NLLLoss, NLLLoss2d, PoissonNLLLoss, SmoothL1Loss, SoftMarginLoss)
from .misc import (ConstantPad1d, ConstantPad2d, CosineSimilarity, Flatten, PairwiseDistance, PixelShuffle,
                   PixelUnshuffle, ReflectionPad1d, ReflectionPad2d, ReplicationPad1d, ReplicationPad2d,
                   Unflatten, Upsample, UpsamplingBilinear2d, UpsamplingNearest2d, ZeroPad1d, ZeroPad2d)
from .norm import (BatchNorm1d, BatchNorm2d, BatchNorm3d, GroupNorm, InstanceNorm1d, InstanceNorm2d,
                   LayerNorm, RMSNorm)
from .pooling import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d,
                      AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d)
from .sparse import Embedding
from .transformer import TransformerEncoder, TransformerEncoderLayer
from .compat import (AdaptiveAvgPool3d, AvgPool3d, CTCLoss, DataParallel, EmbeddingBag, Fold, MaxPool3d,
                     SyncBatchNorm, Unfold)
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .transformer_decoder import Transformer, TransformerDecoder, TransformerDecoderLayer
from .more import (AdaptiveLogSoftmaxWithLoss, AdaptiveMaxPool3d, ChannelShuffle, CircularPad1d, CircularPad2d,
                   CircularPad3d, ConstantPad3d, FeatureAlphaDropout, FractionalMaxPool2d,
                   FractionalMaxPool3d, Hardshrink, HingeEmbeddingLoss, InstanceNorm3d, LazyBatchNorm1d,
                   LazyBatchNorm2d, LazyBatchNorm3d, LazyConv1d, LazyConv2d, LazyConv3d, LazyConvTranspose1d,
                   LazyConvTranspose2d, LazyConvTranspose3d, LazyInstanceNorm1d, LazyInstanceNorm2d,
                   LazyInstanceNorm3d, LazyLinear, LazyModuleMixin, LocalResponseNorm, LPPool1d, LPPool2d, LPPool3d,
                   MaxUnpool1d, MaxUnpool2d, MaxUnpool3d, MultiLabelMarginLoss, MultiLabelSoftMarginLoss,
                   MultiMarginLoss, ReflectionPad3d, ReplicationPad3d, RReLU, Softmax2d, Softshrink, Threshold,
                   TripletMarginLoss, TripletMarginWithDistanceLoss, UninitializedBuffer, UninitializedParameter,
                   ZeroPad3d)
