"""Layers torch programs import (issue 12) against their torch twins: RNN/LSTM/GRU (+ cells,
packed sequences of unequal lengths), Transformer/TransformerDecoder, EmbeddingBag, 3-d pooling,
Fold/Unfold, CTCLoss, SyncBatchNorm, DataParallel, weight_norm/spectral_norm.

Each layer is built under one seed in both libraries: the state dicts must agree key by key
(names, order, shapes, values: init consumes torch's RNG as torch does); then outputs, input
gradients and parameter gradients for a random upstream gradient (float64)."""
from __future__ import annotations

import pytest
import torch

import holoflow as flow
from holoflow import nn

TOL = {"atol": 1e-10, "rtol": 1e-9}


def build(make, seed=0):
    """The holoflow and torch modules built by ``make(lib)`` under the same seed (float64)."""
    torch.manual_seed(seed)
    tm = make(torch.nn).double()
    torch.manual_seed(seed)
    fm = make(nn).double()
    tsd, fsd = tm.state_dict(), fm.state_dict()
    assert list(fsd) == list(tsd), f"state_dict keys {list(fsd)} != torch {list(tsd)}"
    for k in tsd:
        torch.testing.assert_close(fsd[k].to_torch(), tsd[k], msg=lambda m, k=k: f"init of {k}: {m}")
    return fm, tm


def to_flow(x):
    if isinstance(x, torch.Tensor):
        t = flow.from_torch(x.detach().clone())
        return t.requires_grad_(True) if x.requires_grad else t
    if isinstance(x, (list, tuple)):
        return type(x)(to_flow(v) for v in x)
    return x


def leaves(x) -> list:
    if isinstance(x, (torch.Tensor, flow.Tensor)):
        return [x]
    if isinstance(x, nn.utils.rnn.PackedSequence) or isinstance(x, torch.nn.utils.rnn.PackedSequence):
        return [x.data]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in leaves(v)]
    return []


def check(fm, tm, t_args, f_args=None, seed=1, tol=TOL):
    """Runs both, compares every output tensor, then backward of a random weighted sum: input
    and parameter gradients."""
    f_args = to_flow(t_args) if f_args is None else f_args
    t_out, f_out = tm(*t_args), fm(*f_args)
    t_l, f_l = leaves(t_out), leaves(f_out)
    assert len(t_l) == len(f_l)
    for i, (f, t) in enumerate(zip(f_l, t_l)):
        torch.testing.assert_close(f.to_torch(), t.detach(), **tol, msg=lambda m, i=i: f"output {i}: {m}")
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(t.shape, generator=g, dtype=t.dtype) if t.is_floating_point() else None for t in t_l]
    sum((t * w).sum() for t, w in zip(t_l, ws) if t.is_floating_point()).backward()
    sum((f * flow.from_torch(w)).sum() for f, w in zip(f_l, ws) if f.is_floating_point()).backward()
    for i, (f, t) in enumerate(zip(leaves(f_args), leaves(t_args))):
        if t.requires_grad and t.is_leaf:
            torch.testing.assert_close(f.grad.to_torch(), t.grad, **tol, msg=lambda m, i=i: f"grad of input {i}: {m}")
    tp = dict(tm.named_parameters())
    fp = dict(fm.named_parameters())
    assert list(fp) == list(tp)
    for name, p in fp.items():
        if tp[name].grad is None:
            assert p.grad is None or not p.grad.to_torch().any(), name
        else:
            torch.testing.assert_close(p.grad.to_torch(), tp[name].grad, **tol, msg=lambda m, n=name: f"grad {n}: {m}")
    return f_out, t_out


def x64(*shape, seed=0, grad=True):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_(grad)


# -- RNN / LSTM / GRU ----------------------------------------------------------------------------------

RNN_CONFIGS = [
    ("RNN", {}), ("RNN", {"nonlinearity": "relu", "num_layers": 2}), ("RNN", {"bidirectional": True, "bias": False}),
    ("LSTM", {}), ("LSTM", {"num_layers": 2, "bidirectional": True}), ("LSTM", {"batch_first": True}),
    ("LSTM", {"proj_size": 3}), ("LSTM", {"proj_size": 2, "num_layers": 2, "bidirectional": True}),
    ("GRU", {}), ("GRU", {"num_layers": 3, "bidirectional": True, "batch_first": True}), ("GRU", {"bias": False}),
]


@pytest.mark.parametrize("kind,kw", RNN_CONFIGS, ids=[f"{k}{kw}" for k, kw in RNN_CONFIGS])
def test_rnn_layers_match_torch(kind, kw):
    fm, tm = build(lambda lib: getattr(lib, kind)(4, 5, **kw))
    x = x64(2, 6, 4) if kw.get("batch_first") else x64(6, 2, 4)
    check(fm, tm, (x,))


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_rnn_with_initial_state_and_unbatched_input(kind):
    fm, tm = build(lambda lib: getattr(lib, kind)(3, 4, num_layers=2, bidirectional=True))
    h = x64(4, 2, 4, seed=1)
    hx = (h, x64(4, 2, 4, seed=2)) if kind == "LSTM" else h
    check(fm, tm, (x64(5, 2, 3), hx))
    hx1 = (x64(4, 4, seed=3), x64(4, 4, seed=4)) if kind == "LSTM" else x64(4, 4, seed=3)
    check(fm, tm, (x64(5, 3), hx1))          # unbatched (L, H_in) with (D*layers, H) states


def _packed(lib, x, lengths, enforce_sorted):
    return lib.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)


@pytest.mark.parametrize("kind,kw", [("LSTM", {"num_layers": 2, "bidirectional": True}), ("GRU", {"bidirectional": True}),
                                     ("RNN", {"num_layers": 2}), ("LSTM", {"proj_size": 2, "bidirectional": True})])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_rnn_on_packed_sequences_of_unequal_lengths(kind, kw, enforce_sorted):
    fm, tm = build(lambda lib: getattr(lib, kind)(3, 4, **kw))
    lengths = [6, 4, 4, 1] if enforce_sorted else [2, 6, 1, 4]
    x = x64(6, 4, 3)
    xf = to_flow(x)
    t_packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    f_packed = nn.utils.rnn.pack_padded_sequence(xf, lengths, enforce_sorted=enforce_sorted)
    assert f_packed.batch_sizes.tolist() == t_packed.batch_sizes.tolist()
    if not enforce_sorted:
        assert f_packed.sorted_indices.tolist() == t_packed.sorted_indices.tolist()
        assert f_packed.unsorted_indices.tolist() == t_packed.unsorted_indices.tolist()

    class Unpack(torch.nn.Module):   # the same wrapper over both: RNN, then pad back
        def __init__(self, rnn, lib):
            super().__init__()
            self.rnn, self.lib = rnn, lib

        def forward(self, packed):
            out, h = self.rnn(packed)
            padded, lens = self.lib.nn.utils.rnn.pad_packed_sequence(out, total_length=7)
            return padded, h, lens

    class FUnpack(nn.Module):
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, packed):
            out, h = self.rnn(packed)
            padded, lens = nn.utils.rnn.pad_packed_sequence(out, total_length=7)
            return padded, h, lens

    (f_pad, _, f_lens), _ = check(FUnpack(fm), Unpack(tm, torch), (t_packed,), (f_packed,))
    assert f_lens.tolist() == lengths
    # padded positions past each length are zero, and gradients reached only real steps
    for b, n in enumerate(lengths):
        assert not f_pad.to_torch()[n:, b].any()
    torch.testing.assert_close(xf.grad.to_torch(), x.grad, **TOL)
    for b, n in enumerate(lengths):   # steps past a sequence's end get no gradient
        assert not x.grad[n:, b].any()


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_packed_unsorted_with_initial_state_matches_torch(kind):
    """h_0 is given in the caller's batch order: it must be permuted like the packed batch, and
    h_n permuted back."""
    fm, tm = build(lambda lib: getattr(lib, kind)(3, 4, num_layers=2, bidirectional=True))
    lengths = [3, 5, 1, 4]
    x = x64(5, 4, 3)
    h = x64(4, 4, 4, seed=5)
    hx = (h, x64(4, 4, 4, seed=6)) if kind == "LSTM" else h

    class Run(nn.Module):
        def __init__(self, rnn, lib):
            super().__init__()
            self.rnn, self.lib = rnn, lib

        def forward(self, x, hx):
            packed = self.lib.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            out, hn = self.rnn(packed, hx)
            return self.lib.nn.utils.rnn.pad_packed_sequence(out)[0], hn

    class TRun(torch.nn.Module):
        def __init__(self, rnn):
            super().__init__()
            self.rnn = rnn

        def forward(self, x, hx):
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            out, hn = self.rnn(packed, hx)
            return torch.nn.utils.rnn.pad_packed_sequence(out)[0], hn

    check(Run(fm, flow), TRun(tm), (x, hx))


def test_pack_pad_utilities_match_torch():
    seqs = [x64(n, 3, seed=n) for n in (2, 5, 3)]
    fseqs = [to_flow(s) for s in seqs]
    for kw in ({}, {"batch_first": True, "padding_value": -1.0}, {"padding_side": "left"}):
        torch.testing.assert_close(nn.utils.rnn.pad_sequence(fseqs, **kw).to_torch(),
                                   torch.nn.utils.rnn.pad_sequence(seqs, **kw).detach())
    tp = torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)
    fp = nn.utils.rnn.pack_sequence(fseqs, enforce_sorted=False)
    torch.testing.assert_close(fp.data.to_torch(), tp.data.detach())
    for a, b in zip(nn.utils.rnn.unpack_sequence(fp), torch.nn.utils.rnn.unpack_sequence(tp)):
        torch.testing.assert_close(a.to_torch(), b.detach())
    padded, lens = nn.utils.rnn.pad_packed_sequence(fp, batch_first=True, padding_value=9.0)
    tpadded, tlens = torch.nn.utils.rnn.pad_packed_sequence(tp, batch_first=True, padding_value=9.0)
    torch.testing.assert_close(padded.to_torch(), tpadded.detach())
    assert lens.tolist() == tlens.tolist()
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        nn.utils.rnn.pack_sequence(fseqs)
    with pytest.raises(ValueError, match="total_length"):
        nn.utils.rnn.pad_packed_sequence(fp, total_length=2)


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_match_torch(kind):
    fm, tm = build(lambda lib: getattr(lib, kind)(3, 4))
    state = (x64(2, 4, seed=1), x64(2, 4, seed=2)) if kind == "LSTMCell" else x64(2, 4, seed=1)
    check(fm, tm, (x64(2, 3),))
    check(fm, tm, (x64(2, 3), state))
    check(fm, tm, (x64(3),))   # unbatched


def test_rnn_dropout_between_layers_draws_like_torch():
    fm, tm = build(lambda lib: lib.LSTM(3, 4, num_layers=3, dropout=0.4))
    x = x64(5, 2, 3, grad=False)
    torch.manual_seed(3)
    want = tm(x)[0]
    torch.manual_seed(3)
    got = fm(to_flow(x))[0]
    torch.testing.assert_close(got.to_torch(), want.detach(), **TOL)
    fm.eval(), tm.eval()
    torch.testing.assert_close(fm(to_flow(x))[0].to_torch(), tm(x)[0].detach(), **TOL)


def test_rnn_bad_inputs_raise_like_torch():
    lstm = nn.LSTM(3, 4)
    with pytest.raises(RuntimeError, match="input_size.*Expected 3, got 5"):
        lstm(flow.randn(2, 1, 5))
    with pytest.raises(RuntimeError, match="Expected hidden\\[0\\] size \\(1, 1, 4\\), got \\(1, 2, 4\\)"):
        lstm(flow.randn(2, 1, 3), (flow.randn(1, 2, 4), flow.randn(1, 1, 4)))
    with pytest.raises(ValueError, match="proj_size"):
        nn.GRU(3, 4, proj_size=2)


def test_lstm_traces_in_graph_mode():
    fm, tm = build(lambda lib: lib.LSTM(3, 4, num_layers=2, bidirectional=True))

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = fm

        def build(self, x):
            out, (h, c) = self.m(x)
            return out.sum() + h.sum() + c.sum()

    x = x64(5, 2, 3, grad=False)
    out, (h, c) = tm(x)
    torch.testing.assert_close(G()(to_flow(x)).to_torch(), (out.sum() + h.sum() + c.sum()).detach(), **TOL)


def test_packed_gru_traces_in_graph_mode():
    fm, tm = build(lambda lib: lib.GRU(3, 4, bidirectional=True))
    x, lengths = x64(5, 3, 3, grad=False), [2, 5, 3]

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = fm

        def build(self, x):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            out, h = self.m(packed)
            return nn.utils.rnn.pad_packed_sequence(out)[0].sum() + h.sum()

    out, h = tm(torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False))
    want = torch.nn.utils.rnn.pad_packed_sequence(out)[0].sum() + h.sum()
    torch.testing.assert_close(G()(to_flow(x)).to_torch(), want.detach(), **TOL)


# -- Transformer -------------------------------------------------------------------------------------------

def test_transformer_matches_torch_with_masks():
    fm, tm = build(lambda lib: lib.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                                               dim_feedforward=16, dropout=0.0))
    src, tgt = x64(5, 3, 8), x64(4, 3, 8, seed=1)
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    t_args = (src, tgt, None, tgt_mask, None, pad, None, pad)
    f_args = tuple(to_flow(a) for a in t_args)
    check(fm, tm, t_args, f_args, tol={"atol": 1e-9, "rtol": 1e-8})


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decoder_matches_torch(norm_first):
    def make(lib):
        layer = lib.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first,
                                            activation="gelu")
        return lib.TransformerDecoder(layer, 2, norm=lib.LayerNorm(8))
    fm, tm = build(make)
    tgt, mem = x64(2, 4, 8), x64(2, 5, 8, seed=1)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    check(fm, tm, (tgt, mem, mask), tol={"atol": 1e-9, "rtol": 1e-8})


# -- the single-functional layers ---------------------------------------------------------------------------

def _ints(*shape, high=7, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch(mode):
    fm, tm = build(lambda lib: lib.EmbeddingBag(7, 4, mode=mode, padding_idx=1))
    check(fm, tm, (_ints(3, 5),))
    check(fm, tm, (_ints(9), torch.tensor([0, 2, 2, 6])))
    if mode == "sum":
        check(fm, tm, (_ints(3, 5), None, x64(3, 5)))


LAYERS = {
    "maxpool3d": (lambda lib: lib.MaxPool3d(2, 2, 1), (2, 3, 5, 5, 5)),
    "avgpool3d": (lambda lib: lib.AvgPool3d((2, 3, 2), 1, ceil_mode=True), (2, 2, 4, 5, 4)),
    "adaptiveavgpool3d": (lambda lib: lib.AdaptiveAvgPool3d((2, None, 3)), (2, 2, 5, 4, 7)),
    "unfold": (lambda lib: lib.Unfold((2, 3), padding=1, stride=2), (2, 3, 5, 6)),
    "fold": (lambda lib: lib.Fold((4, 5), 2), (2, 12, 12)),
    "syncbatchnorm": (lambda lib: lib.SyncBatchNorm(3), (4, 3, 2, 2)),
    "dataparallel": (lambda lib: lib.DataParallel(lib.Sequential(lib.Linear(3, 4), lib.Tanh())), (5, 3)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_matches_torch(name):
    make, shape = LAYERS[name]
    fm, tm = build(make)
    check(fm, tm, (x64(*shape),))
    if name == "syncbatchnorm":   # running statistics were updated like torch's
        for k, v in tm.state_dict().items():
            torch.testing.assert_close(fm.state_dict()[k].to_torch(), v, **TOL)


def test_ctc_loss_layer_matches_torch():
    fm, tm = build(lambda lib: lib.CTCLoss(blank=0, zero_infinity=True))
    lp = x64(8, 2, 5).log_softmax(-1).detach().requires_grad_(True)
    check(fm, tm, (lp, _ints(2, 3, high=4) + 1, torch.tensor([8, 6]), torch.tensor([3, 2])))


def test_convert_sync_batchnorm_keeps_parameters_and_buffers():
    m = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(2)))
    m[1].running_mean.fill_(0.5)
    w = m[1].weight
    s = nn.SyncBatchNorm.convert_sync_batchnorm(m)
    assert isinstance(s[1], nn.SyncBatchNorm) and isinstance(s[2][0], nn.SyncBatchNorm)
    assert s[1].weight is w and s[1].running_mean.tolist() == [0.5] * 4
    assert list(s.state_dict()) == list(m.state_dict())


def test_sync_batchnorm_on_global_batch_split_uses_statistics_of_every_rank():
    from holoflow.distributed import world
    from holoflow.distributed.global_tensor import from_full
    from holoflow.sbp import B, S
    x = x64(6, 3, 2, grad=False)
    torch.manual_seed(0)
    tm = torch.nn.BatchNorm1d(3).double()
    want = tm(x)

    def fn(r):
        place = flow.placement("cpu", [0, 1])
        m = nn.SyncBatchNorm(3).double()
        m.to_global(place, B)
        y = m(from_full(x, place, S(0)))
        return y.to_global(sbp=B).to_local().to_torch(), m.running_var.to_global(sbp=B).to_local().to_torch()
    for y, rv in world.simulate(2, fn):
        torch.testing.assert_close(y, want.detach(), **TOL)
        torch.testing.assert_close(rv, tm.running_var, **TOL)


def test_sync_batchnorm_on_local_tensors_of_several_ranks_raises():
    from holoflow.distributed import world

    def fn(r):
        m = nn.SyncBatchNorm(3)
        with pytest.raises(NotImplementedError, match="SyncBatchNorm.*one of 2 ranks.*to_global"):
            m(flow.randn(4, 3))
        m.eval()
        return tuple(m(flow.randn(4, 3)).shape)   # eval uses running statistics: no sync needed
    assert world.simulate(2, fn) == [(4, 3), (4, 3)]


def test_data_parallel_wraps_and_prefixes_state_dict():
    fm, tm = build(lambda lib: lib.DataParallel(lib.Linear(3, 2)))
    assert list(fm.state_dict()) == ["module.weight", "module.bias"]
    assert isinstance(nn.parallel.DataParallel(nn.Linear(1, 1)).module, nn.Linear)


# -- weight_norm / spectral_norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, None])
def test_parametrized_weight_norm_matches_torch(dim):
    fm, tm = build(lambda lib: lib.utils.parametrizations.weight_norm(lib.Conv2d(2, 3, 3), dim=dim))
    assert "parametrizations.weight.original0" in fm.state_dict()
    check(fm, tm, (x64(2, 2, 5, 5),))
    torch.testing.assert_close(fm.weight.to_torch(), tm.weight.detach(), **TOL)


def test_parametrized_spectral_norm_matches_torch_in_train_and_eval():
    fm, tm = build(lambda lib: lib.utils.parametrizations.spectral_norm(lib.Linear(4, 5)))
    assert list(fm.state_dict()) == ["bias", "parametrizations.weight.original", "parametrizations.weight.0._u",
                                     "parametrizations.weight.0._v"]
    for _ in range(2):  # each training forward takes one power-iteration step
        check(fm, tm, (x64(3, 4),))
        for k, v in tm.state_dict().items():
            torch.testing.assert_close(fm.state_dict()[k].to_torch(), v, **TOL)
    fm.eval(), tm.eval()
    check(fm, tm, (x64(3, 4),))
    fm2, tm2 = build(lambda lib: lib.utils.parametrizations.spectral_norm(lib.ConvTranspose2d(2, 3, 2)))
    check(fm2, tm2, (x64(1, 2, 3, 3),))


def test_remove_parametrizations_leaves_a_plain_parameter():
    m = nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
    w = m.weight.to_torch().clone()
    nn.utils.parametrize.remove_parametrizations(m, "weight")
    assert list(m.state_dict()) == ["bias", "weight"] and type(m) is nn.Linear
    torch.testing.assert_close(m.weight.to_torch(), w)


def test_hook_weight_norm_matches_torch():
    fm, tm = build(lambda lib: lib.utils.weight_norm(lib.Linear(4, 3)))
    assert list(fm.state_dict()) == ["bias", "weight_g", "weight_v"]
    check(fm, tm, (x64(2, 4),))
    nn.utils.remove_weight_norm(fm)
    torch.nn.utils.remove_weight_norm(tm)
    assert list(fm.state_dict()) == list(tm.state_dict())
    torch.testing.assert_close(fm.weight.to_torch(), tm.weight.detach(), **TOL)


def test_hook_spectral_norm_matches_torch_over_training_steps():
    fm, tm = build(lambda lib: lib.utils.spectral_norm(lib.Conv2d(2, 3, 3)))
    assert list(fm.state_dict()) == ["bias", "weight_orig", "weight_u", "weight_v"]
    for _ in range(3):   # one power-iteration step per training forward
        check(fm, tm, (x64(2, 2, 5, 5),))
        for k, v in tm.state_dict().items():
            torch.testing.assert_close(fm.state_dict()[k].to_torch(), v, **TOL)
    fm.eval(), tm.eval()
    check(fm, tm, (x64(1, 2, 4, 4),))
    nn.utils.remove_spectral_norm(fm)
    torch.nn.utils.remove_spectral_norm(tm)
    assert list(fm.state_dict()) == list(tm.state_dict())
    torch.testing.assert_close(fm.weight.to_torch(), tm.weight.detach(), **TOL)


REPRS = [
    lambda l: l.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1),
    lambda l: l.LSTM(3, 4, proj_size=2), lambda l: l.GRU(3, 4, bias=False), lambda l: l.RNN(3, 4, nonlinearity="relu"),
    lambda l: l.LSTMCell(3, 4), lambda l: l.GRUCell(3, 4, bias=False), lambda l: l.RNNCell(3, 4, nonlinearity="relu"),
    lambda l: l.EmbeddingBag(10, 3, mode="sum"), lambda l: l.EmbeddingBag(10, 3, padding_idx=2, max_norm=1.0),
    lambda l: l.MaxPool3d(3, 2, 1, ceil_mode=True), lambda l: l.AvgPool3d(3, 1, 1), lambda l: l.AdaptiveAvgPool3d(2),
    lambda l: l.Fold((4, 5), 2), lambda l: l.Unfold(2, padding=1), lambda l: l.CTCLoss(), lambda l: l.SyncBatchNorm(3),
    lambda l: l.DataParallel(l.Linear(2, 3)), lambda l: l.TransformerDecoderLayer(8, 2, 16),
    lambda l: l.utils.parametrizations.weight_norm(l.Linear(2, 3)),
    lambda l: l.utils.parametrizations.spectral_norm(l.Linear(2, 3)),
]


@pytest.mark.parametrize("i", range(len(REPRS)))
def test_repr_matches_torch(i):
    assert repr(REPRS[i](nn)) == repr(REPRS[i](torch.nn))


def test_lstm_on_a_global_batch_split_matches_torch():
    """Data parallel on global tensors: the batch axis of x (axis 1) split over 2 simulated
    ranks, weights broadcast; outputs and weight gradients are torch's whole-batch ones."""
    from holoflow.distributed import world
    from holoflow.distributed.global_tensor import from_full
    from holoflow.sbp import B, S
    fm, tm = build(lambda lib: lib.LSTM(3, 4, num_layers=2, bidirectional=True))
    x = x64(5, 4, 3, grad=False)
    out, (h, c) = tm(x)
    (out.sum() + h.sum() + c.sum()).backward()
    sd = {k: v.to_torch() for k, v in fm.state_dict().items()}

    def fn(r):
        place = flow.placement("cpu", [0, 1])
        m = nn.LSTM(3, 4, num_layers=2, bidirectional=True).double()
        m.load_state_dict({k: flow.from_torch(v.clone()) for k, v in sd.items()})
        m.to_global(place, B)
        o, (hn, cn) = m(from_full(x, place, S(1)))
        (o.sum() + hn.sum() + cn.sum()).backward()
        g = m.weight_hh_l1_reverse.grad.to_global(sbp=B).to_local().to_torch()
        return o.to_global(sbp=B).to_local().to_torch(), g
    for o, g in world.simulate(2, fn):
        torch.testing.assert_close(o, out.detach(), **TOL)
        torch.testing.assert_close(g, tm.weight_hh_l1_reverse.grad, **TOL)
