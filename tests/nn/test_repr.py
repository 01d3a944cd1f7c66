"""Module reprs, character for character against torch's."""
from collections import OrderedDict

import pytest
import torch

import holoflow as flow
from holoflow import nn

MAKERS = [
    lambda l: l.Linear(3, 4), lambda l: l.Linear(3, 4, bias=False), lambda l: l.Bilinear(2, 3, 4),
    lambda l: l.Identity(), lambda l: l.Conv1d(2, 4, 3, stride=2, padding=1),
    lambda l: l.Conv2d(3, 8, (3, 5), padding="same", dilation=2, groups=1, bias=False, padding_mode="reflect"),
    lambda l: l.Conv2d(4, 8, 3, groups=2), lambda l: l.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1),
    lambda l: l.BatchNorm1d(3), lambda l: l.BatchNorm2d(3, momentum=None, affine=False),
    lambda l: l.BatchNorm2d(3, track_running_stats=False, bias=False), lambda l: l.LayerNorm([4, 5], eps=1e-6),
    lambda l: l.LayerNorm(4, bias=False), lambda l: l.GroupNorm(2, 4), lambda l: l.RMSNorm(4),
    lambda l: l.RMSNorm([2, 3], eps=1e-5), lambda l: l.InstanceNorm2d(3),
    lambda l: l.Embedding(10, 3), lambda l: l.Embedding(10, 3, padding_idx=-1, max_norm=1.0),
    lambda l: l.Dropout(), lambda l: l.Dropout(0.2, inplace=True), lambda l: l.Dropout2d(0.1),
    lambda l: l.MaxPool2d(2), lambda l: l.MaxPool2d(3, stride=1, padding=1, ceil_mode=True),
    lambda l: l.AvgPool2d(2), lambda l: l.AdaptiveAvgPool2d((2, 3)), lambda l: l.AdaptiveAvgPool2d(1),
    lambda l: l.AdaptiveMaxPool2d(2), lambda l: l.MaxPool1d(3), lambda l: l.AvgPool1d(2),
    lambda l: l.Flatten(), lambda l: l.Flatten(0, 2), lambda l: l.Unflatten(1, (2, 3)),
    lambda l: l.Upsample(scale_factor=2), lambda l: l.Upsample(size=(4, 5), mode="bilinear", align_corners=False),
    lambda l: l.ReLU(), lambda l: l.ReLU(inplace=True), lambda l: l.ReLU6(), lambda l: l.LeakyReLU(0.2),
    lambda l: l.LeakyReLU(inplace=True), lambda l: l.GELU(), lambda l: l.GELU("tanh"), lambda l: l.SiLU(),
    lambda l: l.Mish(), lambda l: l.Hardswish(), lambda l: l.Hardsigmoid(), lambda l: l.Softplus(beta=2),
    lambda l: l.ELU(alpha=0.5), lambda l: l.Tanh(), lambda l: l.Sigmoid(), lambda l: l.Softmax(dim=-1),
    lambda l: l.LogSoftmax(1), lambda l: l.Hardtanh(), lambda l: l.PReLU(), lambda l: l.GLU(),
    lambda l: l.SELU(), lambda l: l.CELU(), lambda l: l.Softmin(0),
    lambda l: l.CrossEntropyLoss(), lambda l: l.MSELoss(reduction="sum"), lambda l: l.BCEWithLogitsLoss(),
    lambda l: l.ZeroPad2d(1), lambda l: l.ConstantPad1d(2, 1.0), lambda l: l.ReflectionPad2d(1),
    lambda l: l.PixelShuffle(2),
    lambda l: l.MultiheadAttention(8, 2), lambda l: l.TransformerEncoderLayer(8, 2, 16, norm_first=True),
    lambda l: l.TransformerEncoder(l.TransformerEncoderLayer(8, 2, 16), 3, norm=l.LayerNorm(8), enable_nested_tensor=False),
    lambda l: l.Sequential(l.Linear(2, 3), l.ReLU(), l.Sequential(l.Linear(3, 3), l.Tanh())),
    lambda l: l.Sequential(OrderedDict(fc=l.Linear(2, 2), act=l.GELU())),
    lambda l: l.ModuleList([l.Linear(2, 2), l.Linear(2, 2), l.ReLU(), l.Linear(2, 2)]),
    lambda l: l.ModuleList(), lambda l: l.ModuleDict({"a": l.ReLU(), "b": l.Linear(1, 1)}),
]


@pytest.mark.parametrize("i", range(len(MAKERS)))
def test_repr_equals_torch(i):
    assert repr(MAKERS[i](nn)) == repr(MAKERS[i](torch.nn))


def test_parameter_list_dict_repr():
    pl = nn.ParameterList([nn.Parameter(flow.ones(2, 3)), flow.zeros(4)])
    assert "(0): Parameter containing: [holoflow.float32 of size 2x3]" in repr(pl)
    tpl = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(2, 3)), torch.zeros(4)])
    assert repr(pl).replace("holoflow.", "torch.") == repr(tpl)
    pd = nn.ParameterDict({"a": flow.ones(2)})
    tpd = torch.nn.ParameterDict({"a": torch.ones(2)})
    assert repr(pd).replace("holoflow.", "torch.") == repr(tpd)
