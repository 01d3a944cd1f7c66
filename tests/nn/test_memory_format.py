"""``memory_format`` in ``Tensor.to`` and ``Module.to``: the layout changes as in torch (it was once
dropped silently, leaving contiguous tensors where torch gives channels_last ones)."""
import pytest
import torch

import holoflow as flow


@pytest.mark.parametrize("fmt, shape", [("channels_last", (2, 3, 4, 5)), ("channels_last_3d", (2, 3, 2, 4, 5))])
def test_tensor_to_memory_format_matches_torch(fmt, shape):
    mf = getattr(torch, fmt)
    base = torch.randn(*shape)
    t = base.clone().requires_grad_()
    f = flow.from_torch(base.clone()).requires_grad_()
    ty, fy = t.to(memory_format=mf), f.to(memory_format=mf)
    assert fy.stride() == ty.stride() and fy.is_contiguous(memory_format=mf)
    assert f.to(torch.float64, memory_format=mf).stride() == t.to(torch.float64, memory_format=mf).stride()
    assert fy.to(memory_format=mf) is fy                       # already in that layout: no copy
    (ty * torch.arange(ty.numel()).reshape(shape)).sum().backward()
    (fy * flow.arange(fy.numel()).reshape(shape)).sum().backward()
    torch.testing.assert_close(f.grad.to_torch(), t.grad)


def test_module_to_channels_last_relays_out_4d_parameters_only():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    torch.manual_seed(0)
    fm = flow.nn.Sequential(flow.nn.Conv2d(3, 4, 3), flow.nn.BatchNorm2d(4))
    assert tm.to(memory_format=torch.channels_last) is tm
    assert fm.to(memory_format=torch.channels_last) is fm
    for (name, tp), (_, fp) in zip(tm.named_parameters(), fm.named_parameters()):
        assert fp.stride() == tp.stride(), name
    assert fm[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 6, 6)
    ty = tm(x.to(memory_format=torch.channels_last))
    fy = fm(flow.from_torch(x).to(memory_format=torch.channels_last))
    torch.testing.assert_close(fy.to_torch(), ty)
    fm.to(memory_format=torch.contiguous_format)
    assert fm[0].weight.is_contiguous()
