"""``holoflow.nn.attention`` as ``torch.nn.attention``: ``sdpa_kernel`` chooses the attention
kernels (math or torch's fused flash kernel on the CPU; none viable raises torch's RuntimeError),
values and gradients equal torch's under the same block, the choice is made when the op is
applied (an nn.Graph traced in the block keeps it); the causal biases of ``nn.attention.bias``
as ``attn_mask``; the imports torch code makes, under mock_torch."""
import warnings

import pytest
import torch
import torch.nn.attention.bias as TB

import holoflow as flow
from holoflow import mock_torch
from holoflow.distributed import world
from holoflow.nn.attention import SDPBackend, sdpa_kernel
from holoflow.nn.attention.bias import CausalVariant, causal_lower_right, causal_upper_left

G = torch.Generator().manual_seed(0)
Q, K, V = (torch.randn(2, 3, s, 8, generator=G) for s in (5, 7, 7))


def _run(lib, attend):
    conv = flow.from_torch if lib is flow else (lambda t: t)
    q, k, v = (conv(t.clone()).requires_grad_() for t in (Q, K, V))
    out = attend(lib, q, k, v)
    up = torch.linspace(-1, 1, out.numel()).reshape(tuple(out.shape))
    grads = lib.autograd.grad(out, (q, k, v), conv(up))
    as_torch = (lambda t: t.detach().to_torch()) if lib is flow else (lambda t: t.detach())
    return [as_torch(out)] + [as_torch(g) for g in grads]


def _sdpa(**kw):
    return lambda lib, q, k, v: lib.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION], ids=["math", "flash"])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}], ids=["plain", "causal"])
def test_the_chosen_kernel_gives_torchs_values_and_gradients(backend, kw):
    with torch.nn.attention.sdpa_kernel([backend]):
        want = _run(torch, _sdpa(**kw))
    with sdpa_kernel([backend]):
        got = _run(flow, _sdpa(**kw))
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)   # (torch's kernel)
    for g, w in zip(got[1:], want[1:]):   # (flash: torch's backward kernel; math: holoflow's math backward)
        torch.testing.assert_close(g, w, **({"rtol": 0, "atol": 0} if backend == SDPBackend.FLASH_ATTENTION else {}))


def test_math_and_flash_differ_as_torchs_do():
    """(else the block would test nothing: the two kernels round differently)"""
    with sdpa_kernel([SDPBackend.MATH]):
        math = _run(flow, _sdpa())[0]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        flash = _run(flow, _sdpa())[0]
    assert not torch.equal(math, flash)
    torch.testing.assert_close(math, flash)


def test_no_viable_kernel_is_torchs_runtime_error():
    with torch.nn.attention.sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(Q, K, V)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), pytest.raises(RuntimeError, match="viable backend"):
        flow.nn.functional.scaled_dot_product_attention(*(flow.from_torch(t) for t in (Q, K, V)))
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()   # restored


def test_a_graph_traced_in_the_block_keeps_its_choice():
    q, k, v = (flow.from_torch(t.clone()) for t in (Q, K, V))

    class Attend(flow.nn.Graph):
        def build(self, q, k, v):
            return flow.nn.functional.scaled_dot_product_attention(q, k, v)

    with sdpa_kernel([SDPBackend.MATH]):
        graph = Attend()
        graph(q, k, v)   # (traced here)
        with torch.nn.attention.sdpa_kernel([SDPBackend.MATH]):
            want = torch.nn.functional.scaled_dot_product_attention(Q, K, V)
    torch.testing.assert_close(graph(q, k, v).to_torch(), want, rtol=0, atol=0)


@pytest.mark.parametrize("make,torch_make", [(causal_lower_right, TB.causal_lower_right),
                                             (causal_upper_left, TB.causal_upper_left)],
                         ids=["lower_right", "upper_left"])
def test_causal_biases_as_masks_equal_torchs(make, torch_make):
    want = _run(torch, _sdpa(attn_mask=torch_make(5, 7)))
    got = _run(flow, _sdpa(attn_mask=make(5, 7)))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.equal(make(5, 7)._materialize().to_torch(), torch_make(5, 7)._materialize("cpu"))
    assert repr(make(2, 3)) == repr(torch_make(2, 3))


def test_causal_bias_errors_and_warning():
    q = flow.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="causal already"):
        flow.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=causal_upper_left(3, 3), is_causal=True)
    with pytest.raises(ValueError, match="causal bias of 3 x 5"):
        flow.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=causal_lower_right(3, 5))
    with pytest.raises(AssertionError, match="2D"):
        causal_lower_right(3, 4, 5)
    with pytest.raises(AssertionError, match="CausalVariant"):
        flow.nn.attention.bias.CausalBias(0, 3, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        causal_lower_right(4, 3)
    assert any("NaNs" in str(w.message) for w in seen)
    assert CausalVariant is TB.CausalVariant


def test_torch_code_imports_them_under_mock_torch():
    with mock_torch.enable():
        from torch.nn.attention import SDPBackend as MockBackend, sdpa_kernel as mock_kernel
        from torch.nn.attention.bias import causal_lower_right as mock_lower_right
        import torch as mocked
        q = mocked.randn(1, 2, 4, 8)
        with mock_kernel(MockBackend.MATH):
            out = mocked.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mock_lower_right(4, 4))
        assert isinstance(out, flow.Tensor) and tuple(out.shape) == (1, 2, 4, 8)


def test_a_lower_right_bias_on_batch_split_global_tensors():
    """The materialized mask is broadcast on the query's placement (a local mask would not mix)."""
    want = torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=TB.causal_lower_right(5, 7))

    def run(rank):
        place = flow.placement("cpu", ranks=[0, 1])
        q, k, v = (flow.from_torch(t.clone()).to_global(place, flow.sbp.broadcast).to_global(sbp=flow.sbp.split(0))
                   for t in (Q, K, V))
        out = flow.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(5, 7))
        return tuple(out.sbp), out.to_global(sbp=flow.sbp.broadcast).to_local().to_torch()

    for sbp, got in world.simulate(2, run):
        assert sbp == (flow.sbp.split(0),)
        torch.testing.assert_close(got, want)
