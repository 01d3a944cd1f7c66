"""``holoflow.nn.attention.flex_attention`` against torch's: outputs and logsumexp of score_mods,
block masks (fully masked rows included), scales and grouped-query heads against torch's CPU
kernel; gradients (torch's CPU kernel has none) against torch autograd through the same math;
BlockMask's blocks, sparsity and the mask combinators; errors; batch-split global tensors on 2
simulated ranks and nn.Graph; the imports torch code makes, under mock_torch."""
import warnings

import pytest
import torch
from torch.nn.attention import flex_attention as tfa

import holoflow as flow
from holoflow import mock_torch
from holoflow.distributed import world
from holoflow.nn.attention import flex_attention as ffa
from holoflow.sbp import B, S

G = torch.Generator().manual_seed(0)
Q, K, V = torch.randn(2, 4, 6, 8, generator=G), torch.randn(2, 2, 10, 8, generator=G), torch.randn(2, 2, 10, 5, generator=G)
BIAS = torch.randn(4, generator=G)


def doc_mask(b, h, q_idx, kv_idx):   # (documents of 3 queries / 5 keys, and a global first key)
    return (q_idx // 3 == kv_idx // 5) | (kv_idx == 0)


def empty_row_mask(b, h, q_idx, kv_idx):   # (query 2 sees no key: zeros, logsumexp -inf)
    return (q_idx != 2) & (kv_idx <= q_idx + b)


def _alibi(bias):
    return lambda s, b, h, q_idx, kv_idx: s + bias[h] * (q_idx - kv_idx)


CASES = {"plain": ({}, None), "doc_mask": ({}, doc_mask), "empty_rows": ({}, empty_row_mask),
         "alibi": ({"score_mod": "alibi"}, None), "scale": ({"scale": 0.3}, doc_mask),
         "both": ({"score_mod": "alibi"}, empty_row_mask)}


def _kwargs(lib, name, place=None):
    kw, mask = CASES[name]
    kw = dict(kw)
    if kw.get("score_mod") == "alibi":   # (on global tensors a captured tensor is global too)
        bias = flow.from_torch(BIAS.clone()) if lib is flow else BIAS
        kw["score_mod"] = _alibi(bias if place is None else bias.to_global(place, B))
    if mask is not None:
        kw["block_mask"] = tfa.create_block_mask(mask, 2, None, 6, 10, device="cpu") if lib is torch else \
            ffa.create_block_mask(mask, 2, None, 6, 10)
    return kw


def _torch_flex(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (torch warns that it compiles on the CPU)
        return tfa.flex_attention(Q, K, V, enable_gqa=True, return_lse=True, **_kwargs(torch, name))


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_and_logsumexp_equal_torchs_kernel(name):
    want, want_lse = _torch_flex(name)
    got, got_lse = ffa.flex_attention(*(flow.from_torch(t.clone()) for t in (Q, K, V)), enable_gqa=True,
                                      return_lse=True, **_kwargs(flow, name))
    torch.testing.assert_close(got.to_torch(), want)
    torch.testing.assert_close(got_lse.to_torch(), want_lse)   # (-inf where a row has no key)


def _reference(q, k, v, bias, mask, scale=None):
    """torch autograd through the math flex_attention computes (torch's CPU kernel has no backward)."""
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = q @ k.transpose(-2, -1) * (scale or 8 ** -0.5)
    b, h, qi, ki = (torch.arange(n).view(*(n if i == j else 1 for j in range(4))) for i, n in enumerate(s.shape))
    if bias is not None:
        s = s + bias[h] * (qi - ki)
    if mask is not None:
        s = s.masked_fill(~mask(b, h, qi, ki), float("-inf"))
    lse = s.logsumexp(-1, keepdim=True)
    return (s - lse.masked_fill(lse == float("-inf"), 0)).exp() @ v


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_equal_torch_autograd_through_the_math(name):
    kw, mask = CASES[name]
    has_bias = kw.get("score_mod") == "alibi"
    tq, tk, tv, tb = (t.clone().requires_grad_() for t in (Q, K, V, BIAS))
    want = _reference(tq, tk, tv, tb if has_bias else None, mask, kw.get("scale"))
    up = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    tgrads = torch.autograd.grad(want, (tq, tk, tv, tb) if has_bias else (tq, tk, tv), up)
    fq, fk, fv, fb = (flow.from_torch(t.detach().clone()).requires_grad_() for t in (tq, tk, tv, tb))
    fkw = _kwargs(flow, name)
    if has_bias:
        fkw["score_mod"] = _alibi(fb)
    got = ffa.flex_attention(fq, fk, fv, enable_gqa=True, **fkw)
    fgrads = flow.autograd.grad(got, (fq, fk, fv, fb) if has_bias else (fq, fk, fv), flow.from_torch(up))
    for g, w in zip(fgrads, tgrads):
        torch.testing.assert_close(g.to_torch(), w)


def test_a_mask_mod_sees_the_real_batch_and_head_as_in_torchs_kernel():
    """created with B = H = None, a mask_mod reading b and h still masks each batch and head by
    its own indices (torch's kernel calls it inside its blocks)."""
    def by_batch(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + 3 * b + h

    for shape in ((None, None), (2, 4)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = tfa.flex_attention(Q, K, V, enable_gqa=True,
                                      block_mask=tfa.create_block_mask(by_batch, *shape, 6, 10, device="cpu"))
        got = ffa.flex_attention(*(flow.from_torch(t.clone()) for t in (Q, K, V)), enable_gqa=True,
                                 block_mask=ffa.create_block_mask(by_batch, *shape, 6, 10))
        torch.testing.assert_close(got.to_torch(), want)


def test_aux_outputs_and_bfloat16():
    fq, fk, fv = (flow.from_torch(t.clone()) for t in (Q, K, V))
    out, aux = ffa.flex_attention(fq, fk, fv, enable_gqa=True, return_aux=ffa.AuxRequest(lse=True, max_scores=True))
    s = Q @ K.repeat_interleave(2, 1).transpose(-2, -1) * 8 ** -0.5
    torch.testing.assert_close(aux.lse.to_torch(), s.logsumexp(-1))
    torch.testing.assert_close(aux.max_scores.to_torch(), s.amax(-1))
    half = ffa.flex_attention(fq.bfloat16(), fk.bfloat16(), fv.bfloat16(), enable_gqa=True)
    assert half.dtype == flow.bfloat16
    torch.testing.assert_close(half.float().to_torch(), out.to_torch(), atol=3e-2, rtol=3e-2)


def test_block_masks_and_combinators_equal_torchs():
    for shape in ((None, None, 300, 260), (2, 3, 130, 129)):
        t, f = tfa.create_block_mask(doc_mask, *shape, device="cpu"), ffa.create_block_mask(doc_mask, *shape)
        assert f.shape == t.shape and f.BLOCK_SIZE == t.BLOCK_SIZE
        assert f.to_dense().tolist() == t.to_dense().tolist()
        assert f.sparsity() == pytest.approx(t.sparsity())
    for combine in ("and_masks", "or_masks"):
        tm, fm = getattr(tfa, combine)(doc_mask, empty_row_mask), getattr(ffa, combine)(doc_mask, empty_row_mask)
        assert torch.equal(ffa.create_mask(fm, 2, 1, 6, 10).to_torch(), tfa.create_mask(tm, 2, 1, 6, 10, "cpu"))
    assert torch.equal(ffa.create_mask(ffa.noop_mask, None, 2, 3, 4).to_torch(),
                       tfa.create_mask(tfa.noop_mask, None, 2, 3, 4, "cpu"))
    assert "sparsity" in repr(ffa.create_block_mask(doc_mask, None, None, 6, 10))


@pytest.mark.parametrize("call,match", [
    (lambda q, k, v: ffa.flex_attention(q, k, v), "heads"),                        # 4 query heads, 2 key heads
    (lambda q, k, v: ffa.flex_attention(q[0], k[0], v[0], enable_gqa=True), "4-D"),
    (lambda q, k, v: ffa.flex_attention(q, k.double(), v, enable_gqa=True), "one dtype"),
    (lambda q, k, v: ffa.flex_attention(q, k[..., :4], v, enable_gqa=True), "must be"),
    (lambda q, k, v: ffa.flex_attention(q, k, v, enable_gqa=True,
                                        block_mask=ffa.create_block_mask(doc_mask, None, None, 6, 12)), "shape"),
    (lambda q, k, v: ffa.flex_attention(q, k, v, enable_gqa=True,
                                        block_mask=ffa.create_block_mask(doc_mask, 3, None, 6, 10)), "B and H"),
])
def test_errors_name_the_shapes(call, match):
    with pytest.raises(ValueError, match=match):
        call(*(flow.from_torch(t.clone()) for t in (Q, K, V)))


def test_batch_split_global_tensors_and_a_graph_equal_torch():
    want, _ = _torch_flex("both")

    class Attend(flow.nn.Graph):
        def __init__(self, place):
            super().__init__()
            self.place = place

        def build(self, q, k, v):
            return ffa.flex_attention(q, k, v, enable_gqa=True, **_kwargs(flow, "both", self.place))

    def run(rank):
        place = flow.placement("cpu", ranks=[0, 1])
        q, k, v = (flow.from_torch(t.clone()).to_global(place, B).to_global(sbp=S(0)) for t in (Q, K, V))
        eager = ffa.flex_attention(q, k, v, enable_gqa=True, **_kwargs(flow, "both", place))
        combined = ffa.flex_attention(q, k, v, enable_gqa=True, block_mask=ffa.create_block_mask(
            ffa.and_masks(doc_mask, ffa.noop_mask), 2, None, 6, 10))
        graph = Attend(place)(q, k, v)
        return [(tuple(o.sbp), o.to_global(sbp=B).to_local().to_torch()) for o in (eager, graph, combined)]

    want_doc, _ = _torch_flex("doc_mask")
    for outs in world.simulate(2, run):
        for (sbp, got), w in zip(outs, (want, want, want_doc)):
            assert sbp == (S(0),)
            torch.testing.assert_close(got, w)


def test_torch_code_imports_it_under_mock_torch():
    with mock_torch.enable():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        import torch as mocked
        q = mocked.randn(1, 2, 4, 8)
        out = flex_attention(q, q, q, block_mask=create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 4, 4))
        assert isinstance(out, flow.Tensor)
        want = mocked.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert (out - want).abs().max().item() < 1e-5
