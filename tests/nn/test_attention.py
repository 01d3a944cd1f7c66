"""MultiheadAttention and TransformerEncoder against torch with equal weights."""
import warnings

import pytest
import torch
import torch.nn.functional as TF

import holoflow as flow
from holoflow import nn

from .helpers import compare, twin

F32, F64 = torch.float32, torch.float64


def _inputs(dtype, batch_first, L=5, S=5, N=3, E=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda n: (N, n, E)) if batch_first else (lambda n: (n, N, E))
    return [torch.randn(*shape(L), generator=g, dtype=dtype), torch.randn(*shape(S), generator=g, dtype=dtype),
            torch.randn(*shape(S), generator=g, dtype=dtype)]


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_mha_matches_torch(dtype, batch_first, need_weights, average):
    make = lambda l: l.MultiheadAttention(8, 2, batch_first=batch_first)
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), dtype)
    q, k, v = _inputs(dtype, batch_first, S=4)
    kpm = torch.tensor([[False, False, True, False], [False] * 4, [False, True, False, True]])  # no fully masked row
    mask = torch.triu(torch.ones(5, 4, dtype=torch.bool), diagonal=1)
    kw = dict(key_padding_mask=kpm, attn_mask=mask, need_weights=need_weights, average_attn_weights=average)
    compare(fm, tm, [q, k, v], dtype, out_index=0, **kw)
    if need_weights:
        fw = fm(*[flow.from_torch(x) for x in (q, k, v)], **{**kw, "key_padding_mask": flow.from_torch(kpm),
                                                            "attn_mask": flow.from_torch(mask)})[1]
        tw = tm(q, k, v, **kw)[1]
        torch.testing.assert_close(fw.to_torch(), tw.detach(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["kdim-vdim", "bias-kv-zero-attn", "float-mask", "unbatched", "nobias"])
def test_mha_variants(variant):
    kw = {"kdim-vdim": dict(kdim=6, vdim=5), "bias-kv-zero-attn": dict(add_bias_kv=True, add_zero_attn=True),
          "nobias": dict(bias=False)}.get(variant, {})
    make = lambda l: l.MultiheadAttention(8, 4, **kw)
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), F64)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 2, 8, generator=g, dtype=F64)
    k = torch.randn(4, 2, kw.get("kdim", 8), generator=g, dtype=F64)
    v = torch.randn(4, 2, kw.get("vdim", 8), generator=g, dtype=F64)
    call = {}
    if variant == "float-mask":
        call["attn_mask"] = torch.randn(5, 4, generator=g, dtype=F64)
    if variant == "unbatched":
        q, k, v = q[:, 0], k[:, 0], v[:, 0]
    if variant == "bias-kv-zero-attn":
        call["key_padding_mask"] = torch.tensor([[False, True, False, False], [False] * 4])
    compare(fm, tm, [q, k, v], F64, out_index=0, **call)
    assert list(fm.state_dict()) == list(tm.state_dict())


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer_matches_torch(dtype, norm_first, activation, batch_first):
    make = lambda l: l.TransformerEncoderLayer(8, 2, 16, dropout=0.1, activation=activation,
                                               batch_first=batch_first, norm_first=norm_first)
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), dtype)
    fm.eval(), tm.eval()  # dropout off (holoflow's dropout masks are not torch's)
    x = _inputs(dtype, batch_first)[0]
    kpm = torch.tensor([[False] * 4 + [True], [False] * 5, [False] * 5])
    compare(fm, tm, [x], dtype, src_key_padding_mask=kpm)


def test_encoder_stack_matches_torch_and_dropout_zero_train():
    def make(l):
        layer = l.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        return l.TransformerEncoder(layer, 3, norm=l.LayerNorm(8), **({"enable_nested_tensor": False} if l is torch.nn else {}))
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), F64)
    assert list(fm.state_dict()) == list(tm.state_dict())
    x = _inputs(F64, True)[0]
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=F64)
    compare(fm, tm, [x], F64, mask=mask)


@pytest.mark.parametrize("case", ["eval-no-grad", "train", "grad", "not-left-aligned", "with-mask", "norm-first",
                                  "float-mask", "no-mask-check", "nested-off"])
def test_encoder_inference_zeroes_padded_positions_like_torchs_nested_path(case):
    """In eval mode without grad, a batch_first encoder given only a left-aligned key padding
    mask runs on nested tensors in torch: its output is 0.0 at the padded positions (before the
    final norm). Every other case computes the padded positions normally."""
    kw = {"enable_nested_tensor": case != "nested-off", "mask_check": case != "no-mask-check"}

    def make(l):
        layer = l.TransformerEncoderLayer(8, 2, 16, dropout=0.0 if case == "train" else 0.1, batch_first=True,
                                          norm_first=case == "norm-first")
        return l.TransformerEncoder(layer, 2, norm=l.LayerNorm(8), **kw)
    with warnings.catch_warnings(record=True) as tw:
        warnings.simplefilter("always")
        tm = make(torch.nn)
    with warnings.catch_warnings(record=True) as fw:
        warnings.simplefilter("always")
        fm, tm = twin(lambda: make(nn), lambda: tm, F32)
    assert [str(w.message) for w in fw] == [str(w.message) for w in tw if "nested" in str(w.message)]
    assert fm.use_nested_tensor == tm.use_nested_tensor
    if case != "train":
        fm.eval(), tm.eval()
    x = _inputs(F32, True)[0]
    kpm = torch.tensor([[False] * 3 + [True] * 2, [False] * 5, [False] * 4 + [True]])
    if case == "not-left-aligned":
        kpm[1, 1] = True
    call = {"src_key_padding_mask": kpm}
    if case == "float-mask":
        call["src_key_padding_mask"] = torch.zeros(kpm.shape).masked_fill(kpm, float("-inf"))
    if case == "with-mask":
        call["mask"] = torch.zeros(5, 5)
    if case in ("grad", "train"):
        compare(fm, tm, [x], F32, **call)
        return
    with torch.no_grad(), flow.no_grad():
        want = tm(x, **call)
        got = fm(flow.from_torch(x), **{k: flow.from_torch(v) for k, v in call.items()})
    torch.testing.assert_close(got.to_torch(), want, atol=1e-5, rtol=1e-4)


def test_torch_mha_state_dict_loads():
    tm = torch.nn.MultiheadAttention(8, 2)
    fm = nn.MultiheadAttention(8, 2)
    assert fm.load_state_dict(tm.state_dict()).missing_keys == []
    assert [n for n, _ in fm.named_parameters()] == ["in_proj_weight", "in_proj_bias", "out_proj.weight",
                                                     "out_proj.bias"]


def _mha_args(lib, separate: bool, bias_kv: bool, static: bool):
    g = torch.Generator().manual_seed(7)
    r = lambda *s: lib.from_numpy(torch.randn(*s, generator=g, dtype=torch.float64).numpy()) if lib is not torch \
        else torch.randn(*s, generator=g, dtype=torch.float64)
    E, H, L, S, N = 8, 2, 4, 5, 3
    q, k, v = r(L, N, E), r(S, N, 6 if separate else E), r(S, N, 5 if separate else E)
    kw = dict(embed_dim_to_check=E, num_heads=H, in_proj_weight=None if separate else r(3 * E, E),
              in_proj_bias=r(3 * E), bias_k=r(1, 1, E) if bias_kv else None, bias_v=r(1, 1, E) if bias_kv else None,
              add_zero_attn=not bias_kv, dropout_p=0.0, out_proj_weight=r(E, E), out_proj_bias=r(E),
              use_separate_proj_weight=separate)
    if separate:
        kw.update(q_proj_weight=r(E, E), k_proj_weight=r(E, 6), v_proj_weight=r(E, 5))
    if static:
        kw.update(static_k=r(N * H, S, E // H), static_v=r(N * H, S, E // H))
    return q, k, v, kw


@pytest.mark.parametrize("separate,bias_kv,static,need_weights", [
    (False, False, False, True), (True, False, False, True), (False, True, False, False),
    (True, False, True, True), (False, False, True, False)])
def test_functional_multi_head_attention_forward_matches_torch(separate, bias_kv, static, need_weights):
    """``F.multi_head_attention_forward`` (nn.MultiheadAttention's computation) with packed or
    separate projections, bias_k/v or zero attention, static keys and values, with and without
    the weights, against torch's; gradients of the output too."""
    tq, tk, tv, tkw = _mha_args(torch, separate, bias_kv, static)
    fq, fk, fv, fkw = _mha_args(flow, separate, bias_kv, static)
    for t in [tq] + [x for x in tkw.values() if isinstance(x, torch.Tensor)]:
        t.requires_grad_()
    for t in [fq] + [x for x in fkw.values() if isinstance(x, flow.Tensor)]:
        t.requires_grad_()
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[1, -1] = True
    t_out, t_w = TF.multi_head_attention_forward(tq, tk, tv, key_padding_mask=mask, need_weights=need_weights, **tkw)
    f_out, f_w = flow.nn.functional.multi_head_attention_forward(fq, fk, fv, key_padding_mask=flow.from_torch(mask),
                                                                 need_weights=need_weights, **fkw)
    torch.testing.assert_close(f_out.detach().to_torch(), t_out.detach())
    assert (f_w is None) == (t_w is None)
    if t_w is not None:
        torch.testing.assert_close(f_w.detach().to_torch(), t_w.detach())
    t_out.sum().backward()
    f_out.sum().backward()
    torch.testing.assert_close(fq.grad.to_torch(), tq.grad)
    torch.testing.assert_close(fkw["out_proj_weight"].grad.to_torch(), tkw["out_proj_weight"].grad)


@pytest.mark.parametrize("inputs", ["self", "kv-shared", "all-different"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_mha_packs_its_in_projection_as_torch_bit_for_bit_in_bfloat16(inputs, batch_first):
    """torch projects self-attention's ``q is k is v`` by one matmul of the packed weight (and a
    shared key/value by one), keeping that identity through batch_first's transpose; holoflow
    took three matmuls, so under bfloat16 autocast the input's gradient was the sum of three
    rounded products, 1 ulp off torch's (a ViT's step drifted 4e-4 in a second step)."""
    results = []
    for lib in (torch, flow):
        lib.manual_seed(0)
        mha = lib.nn.MultiheadAttention(8, 2, batch_first=batch_first)
        x = lib.randn(3, 5, 8, requires_grad=True)
        y = lib.randn(3, 5, 8, requires_grad=True)
        q, k, v = {"self": (x, x, x), "kv-shared": (x, y, y), "all-different": (x, y, y * 1)}[inputs]
        with lib.autocast("cpu", dtype=lib.bfloat16):
            out = mha(q, k, v, need_weights=False)[0]
        (out.float() * lib.linspace(-1, 1, 8)).sum().backward()
        results.append([out.detach().float(), x.grad, y.grad, mha.in_proj_weight.grad, mha.in_proj_bias.grad])
    for want, got in zip(*results):
        if want is None:
            assert got is None
            continue
        assert torch.equal(got.to_torch() if isinstance(got, flow.Tensor) else got, want)
