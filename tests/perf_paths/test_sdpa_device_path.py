"""scaled_dot_product_attention in the autocast dtype, and the path CUDA takes (torch's fused
kernels forward and backward, ops/attention.py ``FUSED_VJP_DEVICES``), run here on CPU by adding
"cpu" to those devices. Values and grads against torch's ``F.scaled_dot_product_attention``
(causal, bool mask, float mask with its gradient, value head size differing), the dtype kept
under autocast, and which aten kernels the backward runs (no float32 math path)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import holoflow as flow
import holoflow.nn.functional as HF
from holoflow.ops import attention


class _Aten(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def device_path(monkeypatch):
    monkeypatch.setattr(attention, "FUSED_VJP_DEVICES", {"cuda", "cpu"})


def _inputs(kind: str, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    B, H, L, S, E = 2, 3, 5, 5 if kind == "causal" else 7, 8
    Ev = 4 if kind == "value_dim" else E
    q, k, v = (torch.randn(*s, generator=g, dtype=dtype) for s in ((B, H, L, E), (B, H, S, E), (B, H, S, Ev)))
    mask = None
    if kind == "bool_mask":
        mask = torch.rand(L, S, generator=g) > 0.3
        mask[:, 0] = True   # no fully masked row
    elif kind == "float_mask":
        mask = torch.randn(1, H, L, S, generator=g, dtype=dtype)
    return q, k, v, mask


def _compare(kind: str, autocast: bool, atol: float):
    q, k, v, mask = _inputs(kind)
    causal = kind == "causal"
    diff_mask = mask is not None and mask.is_floating_point()
    tt = [x.clone().requires_grad_() for x in (q, k, v)] + [mask.clone().requires_grad_() if diff_mask else mask]
    ft = [flow.tensor(x.numpy(), requires_grad=True) for x in (q, k, v)]
    ft.append(None if mask is None else flow.tensor(mask.numpy(), requires_grad=diff_mask))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        want = F.scaled_dot_product_attention(*tt[:3], attn_mask=tt[3], is_causal=causal)
    with flow.autocast("cpu", dtype=flow.bfloat16, enabled=autocast):
        got = HF.scaled_dot_product_attention(*ft[:3], attn_mask=ft[3], is_causal=causal)
    assert got.to_torch().dtype == want.dtype == (torch.bfloat16 if autocast else torch.float32)
    torch.testing.assert_close(got.to_torch(), want.detach(), atol=atol, rtol=atol)
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(want.dtype)
    want.backward(dy)
    aten = _Aten()
    with aten:
        got.backward(flow.tensor(dy.float().numpy()).to(got.dtype))
    for t, f in zip(tt, ft):
        if f is not None and f.requires_grad:
            torch.testing.assert_close(f.grad.to_torch(), t.grad, atol=atol, rtol=atol)
    return aten.ops


KINDS = ["causal", "no_mask", "bool_mask", "float_mask", "value_dim"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("autocast", [False, True])
def test_device_path_matches_torch(device_path, kind, autocast):
    ops = _compare(kind, autocast, atol=2e-2 if autocast else 1e-5)
    # the backward is torch's own fused kernel, never the float32 math path
    assert not {"logsumexp", "masked_fill", "_softmax"} & {o.split(".")[0] for o in ops}, ops
    if kind in ("causal", "no_mask"):
        assert any(o.startswith("_scaled_dot_product_flash_attention_for_cpu_backward") for o in ops), ops


@pytest.mark.parametrize("kind", KINDS)
def test_autocast_runs_in_bf16_and_matches_torch(kind):
    _compare(kind, autocast=True, atol=2e-2)


def test_device_path_bf16_forward_has_no_float32_scores(device_path):
    q, k, v, _ = _inputs("causal", torch.bfloat16)
    aten = _Aten()
    with aten:
        y = attention._sdpa_kernel(q, k, v, None, True, None)[0]
    assert y.dtype == torch.bfloat16
    assert not {"logsumexp", "masked_fill", "_to_copy"} & {o.split(".")[0] for o in aten.ops}, aten.ops
