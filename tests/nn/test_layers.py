"""Every layer against its torch twin with equal weights: outputs, input and parameter grads,
buffers, float32 and float64, train and eval."""
import pytest
import torch

from holoflow import nn

from .helpers import compare, twin

F32, F64 = torch.float32, torch.float64


def r(*shape):
    return lambda g: torch.randn(*shape, generator=g, dtype=torch.float64)


def idx(high, *shape):
    return lambda g: torch.randint(0, high, shape, generator=g)


def pos(*shape):
    return lambda g: torch.rand(*shape, generator=g, dtype=torch.float64).clamp(0.05, 0.95)


LAYERS = {
    "linear": (lambda l: l.Linear(5, 3), [r(4, 5)]),
    "linear-3d-nobias": (lambda l: l.Linear(5, 3, bias=False), [r(2, 4, 5)]),
    "bilinear": (lambda l: l.Bilinear(3, 4, 2), [r(5, 3), r(5, 4)]),
    "identity": (lambda l: l.Identity(7), [r(2, 3)]),
    "conv1d": (lambda l: l.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), [r(2, 4, 9)]),
    "conv2d": (lambda l: l.Conv2d(3, 4, 3, padding=1), [r(2, 3, 6, 5)]),
    "conv2d-same-reflect": (lambda l: l.Conv2d(2, 3, (3, 2), padding="same", padding_mode="reflect",
                                               bias=False), [r(1, 2, 5, 6)]),
    "conv2d-dilated": (lambda l: l.Conv2d(2, 4, 3, stride=2, dilation=2), [r(2, 2, 9, 9)]),
    "convtranspose2d": (lambda l: l.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
                        [r(2, 3, 4, 4)]),
    "convtranspose1d": (lambda l: l.ConvTranspose1d(3, 2, 3, stride=2), [r(2, 3, 5)]),
    "batchnorm1d": (lambda l: l.BatchNorm1d(3), [r(6, 3)]),
    "batchnorm1d-3d": (lambda l: l.BatchNorm1d(3, momentum=None), [r(4, 3, 5)]),
    "batchnorm2d": (lambda l: l.BatchNorm2d(3), [r(2, 3, 4, 4)]),
    "batchnorm2d-noaffine": (lambda l: l.BatchNorm2d(3, affine=False), [r(2, 3, 4, 4)]),
    "batchnorm2d-nostats": (lambda l: l.BatchNorm2d(3, track_running_stats=False), [r(2, 3, 4, 4)]),
    "layernorm": (lambda l: l.LayerNorm(6), [r(3, 4, 6)]),
    "layernorm-2d-nobias": (lambda l: l.LayerNorm([4, 6], bias=False), [r(3, 4, 6)]),
    "groupnorm": (lambda l: l.GroupNorm(2, 4), [r(3, 4, 5)]),
    "rmsnorm": (lambda l: l.RMSNorm(6, eps=1e-6), [r(3, 6)]),
    "rmsnorm-default-eps": (lambda l: l.RMSNorm([2, 6]), [r(3, 2, 6)]),
    "instancenorm2d": (lambda l: l.InstanceNorm2d(3, affine=True), [r(2, 3, 4, 4)]),
    "instancenorm1d-running": (lambda l: l.InstanceNorm1d(3, track_running_stats=True, momentum=0.3),
                               [r(4, 3, 6)]),
    "instancenorm2d-running-affine": (lambda l: l.InstanceNorm2d(3, affine=True, track_running_stats=True),
                                      [r(2, 3, 4, 5)]),
    "instancenorm3d-running-cumulative": (lambda l: l.InstanceNorm3d(2, track_running_stats=True, momentum=None),
                                          [r(2, 2, 3, 2, 3)]),
    "embedding": (lambda l: l.Embedding(10, 4), [idx(10, 3, 5)]),
    "embedding-pad": (lambda l: l.Embedding(10, 4, padding_idx=2), [lambda g: torch.tensor([[2, 1, 2], [0, 2, 9]])]),
    "maxpool2d": (lambda l: l.MaxPool2d(2), [r(2, 3, 6, 6)]),
    "maxpool2d-pad": (lambda l: l.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), [r(1, 2, 7, 7)]),
    "avgpool2d": (lambda l: l.AvgPool2d(3, stride=2, padding=1), [r(2, 3, 7, 7)]),
    "adaptiveavgpool2d": (lambda l: l.AdaptiveAvgPool2d((2, 3)), [r(2, 3, 7, 8)]),
    "adaptiveavgpool2d-1": (lambda l: l.AdaptiveAvgPool2d(1), [r(2, 3, 5, 5)]),
    "flatten": (lambda l: l.Flatten(), [r(2, 3, 4)]),
    "unflatten": (lambda l: l.Unflatten(1, (3, 4)), [r(2, 12)]),
    "upsample-nearest": (lambda l: l.Upsample(scale_factor=2), [r(1, 2, 3, 3)]),
    "upsample-bilinear": (lambda l: l.Upsample(size=(5, 7), mode="bilinear", align_corners=False), [r(1, 2, 3, 4)]),
    "relu": (lambda l: l.ReLU(), [r(3, 4)]), "relu6": (lambda l: l.ReLU6(), [lambda g: 4 * torch.randn(3, 4, generator=g, dtype=torch.float64)]),
    "leakyrelu": (lambda l: l.LeakyReLU(0.2), [r(3, 4)]),
    "gelu": (lambda l: l.GELU(), [r(3, 4)]), "gelu-tanh": (lambda l: l.GELU("tanh"), [r(3, 4)]),
    "silu": (lambda l: l.SiLU(), [r(3, 4)]), "mish": (lambda l: l.Mish(), [r(3, 4)]),
    "hardswish": (lambda l: l.Hardswish(), [lambda g: 4 * torch.randn(3, 4, generator=g, dtype=torch.float64)]),
    # torch's float64 hardsigmoid backward uses 1/6 rounded to float32; holoflow's is exact
    "hardsigmoid": (lambda l: l.Hardsigmoid(), [lambda g: 4 * torch.randn(3, 4, generator=g, dtype=torch.float64)], 1e-7),
    "softplus": (lambda l: l.Softplus(beta=2.0, threshold=3.0), [r(3, 4)]),
    "elu": (lambda l: l.ELU(alpha=0.5), [r(3, 4)]), "tanh": (lambda l: l.Tanh(), [r(3, 4)]),
    "sigmoid": (lambda l: l.Sigmoid(), [r(3, 4)]), "softmax": (lambda l: l.Softmax(dim=1), [r(3, 4)]),
    "logsoftmax": (lambda l: l.LogSoftmax(dim=-1), [r(3, 4)]), "hardtanh": (lambda l: l.Hardtanh(-0.5, 0.5), [r(3, 4)]),
    "selu": (lambda l: l.SELU(), [r(3, 4)]), "softmin": (lambda l: l.Softmin(0), [r(3, 4)]),
    "logsigmoid": (lambda l: l.LogSigmoid(), [r(3, 4)]),
    "dropout-eval-or-p0": (lambda l: l.Dropout(0.0), [r(3, 4)]),
    "sequential": (lambda l: l.Sequential(l.Linear(4, 8), l.GELU(), l.LayerNorm(8), l.Linear(8, 2)), [r(5, 4)]),
}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_matches_torch(name, mode, dtype):
    make, inputs, *atol = LAYERS[name]
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), dtype)
    if mode == "eval":
        fm.eval(), tm.eval()
    g = torch.Generator().manual_seed(3)
    xs = [f(g) for f in inputs]
    xs = [x.to(dtype) if x.is_floating_point() else x for x in xs]
    compare(fm, tm, xs, dtype, atol=atol[0] if atol and dtype == F64 else None)
    if mode == "train" and ("batchnorm" in name or "running" in name):  # a second step: running stats move on
        compare(fm, tm, [x * 2 + 1 for x in xs], dtype)


def test_batchnorm_eval_uses_running_stats():
    fm, tm = twin(lambda: nn.BatchNorm2d(3, momentum=0.3), lambda: torch.nn.BatchNorm2d(3, momentum=0.3), F64)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        compare(fm, tm, [torch.randn(4, 3, 2, 2, generator=g, dtype=F64) * 3 + 1], F64)
    assert int(fm.num_batches_tracked) == 3
    fm.eval(), tm.eval()
    compare(fm, tm, [torch.randn(4, 3, 2, 2, generator=g, dtype=F64)], F64)
    with pytest.raises(ValueError, match="expected 4D input"):
        fm(nn.Flatten()(__import__("holoflow").ones(2, 3, 4)))


def test_dropout_train_scales_and_eval_is_identity():
    import holoflow as flow
    m = nn.Dropout(0.5)
    x = flow.ones(1000)
    y = m(x).to_torch()
    assert set(y.unique().tolist()) <= {0.0, 2.0} and 300 < int((y == 0).sum()) < 700
    m.eval()
    assert m(x) is x or bool((m(x) == x).all())
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


def test_embedding_from_pretrained_and_padding_grad():
    import holoflow as flow
    w = flow.randn(5, 3)
    e = nn.Embedding.from_pretrained(w)
    assert not e.weight.requires_grad and e.weight._data.data_ptr() == w._data.data_ptr()
    e2 = nn.Embedding.from_pretrained(w, freeze=False, padding_idx=1)
    e2(flow.tensor([1, 1, 2])).sum().backward()
    assert float(e2.weight.grad[1].abs().sum()) == 0 and float(e2.weight.grad[2].abs().sum()) == 3
