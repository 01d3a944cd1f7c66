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


def _forward_kernels(ops: list[str]) -> set[str]:
    return {o for o in ops if o.startswith("_scaled_dot_product_flash_attention_for_cpu")
            and "backward" not in o}


@pytest.mark.parametrize("kind", KINDS)
def test_device_path_backward_does_not_recompute_the_forward(device_path, monkeypatch, kind):
    """The forward keeps torch's node (masks and a differing value head size too): the backward
    records no forward again, and without a mask runs only the fused backward kernel."""
    recorded = []
    real = attention._recorded
    monkeypatch.setattr(attention, "_recorded", lambda *a: recorded.append(1) or real(*a))
    ops = _compare(kind, autocast=True, atol=2e-2)
    assert len(recorded) == 1
    if kind in ("causal", "no_mask"):
        assert not _forward_kernels(ops), ops


def test_device_path_retain_graph_and_lost_handle(device_path):
    """A second backward (retain_graph) gives the same grads; a logsumexp without the node (a copy)
    falls back to recomputing, with the same result."""
    q, k, v, _ = _inputs("causal")
    fq = flow.tensor(q.numpy(), requires_grad=True)
    y = HF.scaled_dot_product_attention(fq, flow.tensor(k.numpy()), flow.tensor(v.numpy()), is_causal=True)
    y.sum().backward(retain_graph=True)
    first = fq.grad.to_torch().clone()
    y.sum().backward()
    torch.testing.assert_close(fq.grad.to_torch(), 2 * first)
    out, lse = attention._sdpa_kernel(q, k, v, None, True, None)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    kept = attention._sdpa_fused_bwd_kernel(dy, q, k, v, out, lse, True, None)
    lost = attention._sdpa_fused_bwd_kernel(dy, q, k, v, out, lse.clone(), True, None)
    for a, b in zip(kept, lost):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_device_path_node_freed_with_the_saved_tensors(device_path, monkeypatch):
    """torch's node (and what it saved) lives only as long as holoflow keeps the logsumexp."""
    import gc
    import weakref
    refs = []
    real = attention._recorded

    def spy(*args):
        out, vjp = real(*args)
        refs.append(weakref.ref(vjp))
        return out, vjp
    monkeypatch.setattr(attention, "_recorded", spy)
    q, k, v, _ = _inputs("causal")
    fq = flow.tensor(q.numpy(), requires_grad=True)
    y = HF.scaled_dot_product_attention(fq, flow.tensor(k.numpy()), flow.tensor(v.numpy()), is_causal=True)
    assert refs and refs[0]() is not None
    y.sum().backward()
    del y
    gc.collect()
    assert refs[0]() is None


def _train_attention(mode: str) -> tuple:
    """Three SGD steps of a linear layer feeding causal attention, eagerly or as an nn.Graph."""
    q, _, _, _ = _inputs("causal")
    flow.manual_seed(0)
    lin = flow.nn.Linear(8, 8)
    opt = flow.optim.SGD(lin.parameters(), lr=0.5)

    def step(x):
        y = HF.scaled_dot_product_attention(lin(x), x, x, is_causal=True)
        loss = (y * y).sum()
        loss.backward()
        return loss
    x = flow.tensor(q.numpy())
    if mode == "graph":
        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.lin = lin
                self.add_optimizer(opt)

            def build(self, x):
                return step(x)
        g = G()
        losses = [g(x).to_torch() for _ in range(3)]
    else:
        losses = []
        for _ in range(3):
            opt.zero_grad()
            losses.append(step(x).detach().to_torch())
            opt.step()
    return torch.stack(losses), lin.weight.to_torch().detach().clone()


def test_device_path_in_a_graph(monkeypatch):
    """nn.Graph on the device path (torch's node handed from the forward task to the backward one)
    equals nn.Graph on the CPU path bit for bit (the same CPU flash kernels), and eager."""
    cpu_graph = _train_attention("graph")
    monkeypatch.setattr(attention, "FUSED_VJP_DEVICES", {"cuda", "cpu"})
    recorded = []
    real = attention._recorded
    monkeypatch.setattr(attention, "_recorded", lambda *a: recorded.append(1) or real(*a))
    dev_graph, dev_eager = _train_attention("graph"), _train_attention("eager")
    assert len(recorded) == 6     # one per forward (3 steps each): every backward found its node
    for a, b, c in zip(dev_graph, cpu_graph, dev_eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)   # graph vs eager: summation order


@pytest.mark.parametrize("kind", KINDS)
def test_device_path_records_nothing_without_grad(device_path, monkeypatch, kind):
    """Under no_grad no backward can follow: the plain fused call, nothing kept."""
    recorded = []
    real = attention._recorded
    monkeypatch.setattr(attention, "_recorded", lambda *a: recorded.append(1) or real(*a))
    q, k, v, mask = _inputs(kind)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=kind == "causal")
    with flow.no_grad():
        got = HF.scaled_dot_product_attention(*(flow.from_torch(x) for x in (q, k, v)),
                                              attn_mask=None if mask is None else flow.from_torch(mask),
                                              is_causal=kind == "causal")
    torch.testing.assert_close(got.to_torch(), want, rtol=1e-5, atol=1e-5)
    assert not recorded
