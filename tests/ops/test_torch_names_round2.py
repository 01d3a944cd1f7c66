"""torch's remaining top-level functions (round 2) against torch: ``segment_reduce``, the
randomized ``svd_lowrank``/``pca_lowrank``, the deprecated ``lu`` and norms, the ATen-style
spellings (``convolution``, ``grid_sampler``, ``ctc_loss`` with enum reductions, ``embedding_bag``'s
4-tuple), the recurrent functions and cells, and ``feature_dropout``: values and gradients per
dtype, a float64 gradcheck and the SBP signatures of the ops they dispatch (the harness), plus
torch's exception classes for bad input."""
import warnings

import pytest
import torch

import holoflow as flow
from harness import Case, error_like_torch, parametrize, randn


def lib_of(*ts):
    return flow if any(isinstance(t, flow.Tensor) for t in ts) else torch


def same(name, fn, make, **kw):
    return Case(name, fn, fn, make, **kw)


def quiet(fn):
    def run(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args, **kwargs)
    return run


def segments(reduce, lengths=None, offsets=None, shape=(6, 3), axis=0, initial=None, distinct=True):
    def make(dt, g):
        n = 1
        for s in shape:
            n *= s
        data = (torch.randperm(n, generator=g).to(dt).reshape(shape) / n) if distinct else randn(*shape, gen=g, dtype=dt)
        kw = {"axis": axis}
        if lengths is not None:
            kw["lengths"] = torch.tensor(lengths)
        if offsets is not None:
            kw["offsets"] = torch.tensor(offsets)
        if initial is not None:
            kw["initial"] = initial
        return (data, reduce), kw
    return make


def seg(data, reduce, **kw):
    return lib_of(data).segment_reduce(data, reduce, **kw)


def lowrank(fn_name, shape, **kw):
    def fn(A, *args):
        return getattr(lib_of(A), fn_name)(A, *args, **kw)
    return Case(f"{fn_name}{shape}{sorted(kw)}", fn, fn, lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {}),
                random=True, atol=1e-4, rtol=1e-4)


def rnn_params(mode, inp, hid, layers, dirs, bias=True, dt=torch.float32, g=None):
    gates = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}[mode]
    ps = []
    for layer in range(layers):
        for _ in range(dirs):
            i = inp if layer == 0 else hid * dirs
            ps += [randn(gates * hid, i, gen=g, dtype=dt) * 0.5, randn(gates * hid, hid, gen=g, dtype=dt) * 0.5]
            if bias:
                ps += [randn(gates * hid, gen=g, dtype=dt) * 0.1, randn(gates * hid, gen=g, dtype=dt) * 0.1]
    return ps


def rnn_case(mode, layers=2, bidirectional=True, batch_first=False, bias=True):
    dirs = 2 if bidirectional else 1

    def make(dt, g):
        x = randn(*((3, 4, 5) if batch_first else (4, 3, 5)), gen=g, dtype=dt)
        h = randn(layers * dirs, 3, 6, gen=g, dtype=dt)
        hx = [h, randn(layers * dirs, 3, 6, gen=g, dtype=dt)] if mode == "lstm" else h
        return (x, hx, rnn_params(mode, 5, 6, layers, dirs, bias, dt, g), bias, layers, 0.0, True, bidirectional,
                batch_first), {}

    def fn(x, *args):
        return getattr(lib_of(x), mode)(x, *args)
    return Case(f"{mode}-l{layers}-bi{bidirectional}-bf{batch_first}-b{bias}", fn, fn, make, gradcheck=False,
                atol=1e-4, rtol=1e-4)


def cell_case(name, gates, lstm=False, bias=True):
    def make(dt, g):
        x, h = randn(3, 4, gen=g, dtype=dt), randn(3, 5, gen=g, dtype=dt)
        hx = [h, randn(3, 5, gen=g, dtype=dt)] if lstm else h
        ws = [randn(gates * 5, 4, gen=g, dtype=dt), randn(gates * 5, 5, gen=g, dtype=dt)]
        bs = [randn(gates * 5, gen=g, dtype=dt), randn(gates * 5, gen=g, dtype=dt)] if bias else []
        return (x, hx, *ws, *bs), {}

    def fn(x, *args):
        return getattr(lib_of(x), name)(x, *args)
    return Case(f"{name}-bias{bias}", fn, fn, make)


def _ctc(dt, g):
    T, N, C, S = 6, 3, 4, 3
    lp = torch.log_softmax(randn(T, N, C, gen=g, dtype=dt), -1)
    targets = torch.randint(1, C, (N, S), generator=g)
    return (lp, targets, [6, 5, 6], [3, 2, 1]), {}


def ctc(reduction):
    def fn(lp, t, il, tl):
        return lib_of(lp).ctc_loss(lp, t, il, tl, 0, reduction, False)
    return Case(f"ctc_loss-{reduction}", fn, fn, _ctc, gradcheck=False)


def bag(mode):
    def make(dt, g):
        return (randn(6, 3, gen=g, dtype=dt), torch.tensor([0, 2, 4, 5, 1]), torch.tensor([0, 2, 2])), {}

    def fn(w, idx, off):
        return lib_of(w).embedding_bag(w, idx, off, False, mode)
    return Case(f"embedding_bag-mode{mode}", fn, fn, make, sbp=False)


def conv(transposed, groups=1):
    def make(dt, g):
        if transposed:   # weight (C_in, C_out / groups, kH, kW)
            return (randn(3, 4, 5, 5, gen=g, dtype=dt), randn(4, 3 // groups, 3, 3, gen=g, dtype=dt),
                    randn(3, gen=g, dtype=dt)), {}
        return (randn(3, 4, 6, 6, gen=g, dtype=dt), randn(6, 4 // groups, 3, 3, gen=g, dtype=dt),
                randn(6, gen=g, dtype=dt)), {}

    def fn(x, w, b):
        return lib_of(x).convolution(x, w, b, [2, 1], [1], [1, 1], transposed, [1, 0] if transposed else [0, 0],
                                     groups)
    return Case(f"convolution-t{transposed}-g{groups}", fn, fn, make)


def grid(name, five_d, interp, pad, align):
    def make(dt, g):
        if five_d:
            return (randn(1, 2, 3, 4, 4, gen=g, dtype=dt), randn(1, 2, 3, 2, 3, gen=g, dtype=dt) * 0.8), {}
        return (randn(2, 2, 4, 5, gen=g, dtype=dt), randn(2, 3, 3, 2, gen=g, dtype=dt) * 0.8), {}

    def fn(x, gr):
        return getattr(lib_of(x), name)(x, gr, interp, pad, align)
    return Case(f"{name}-{interp}-{pad}-{align}", fn, fn, make, gradcheck=interp != 1)


def _ormqr(left):
    def make(dt, g):
        a, tau = torch.geqrf(randn(5, 3, gen=g, dtype=dt))
        return (a, tau, randn(*((5, 2) if left else (2, 5)), gen=g, dtype=dt)), {}
    return make


def _householder(dt, g):
    a, tau = torch.geqrf(randn(5, 3, gen=g, dtype=dt))
    return (a, tau), {}


def _bn_inputs(dt, g):
    return (randn(4, 3, 5, gen=g, dtype=dt), randn(3, gen=g, dtype=dt), randn(3, gen=g, dtype=dt)), {}


CASES = [
    same("segment_reduce-sum-empty", seg, segments("sum", lengths=[2, 0, 4])),
    same("segment_reduce-mean", seg, segments("mean", lengths=[2, 1, 3])),
    same("segment_reduce-max", seg, segments("max", lengths=[2, 1, 3])),
    same("segment_reduce-min-offsets", seg, segments("min", offsets=[0, 2, 3, 6])),
    same("segment_reduce-prod", seg, segments("prod", lengths=[3, 3], distinct=False)),
    # (torch's own derivative of a segment whose max is ``initial`` disagrees with finite differences;
    # holoflow's gradient is torch's, which test_vs_torch checks)
    same("segment_reduce-max-initial", seg, segments("max", lengths=[2, 0, 4], initial=0.5), gradcheck=False),
    same("segment_reduce-axis1", seg, segments("sum", lengths=[[1, 3], [2, 2]], shape=(2, 4, 3), axis=1)),
    lowrank("svd_lowrank", (7, 5), q=3),
    lowrank("svd_lowrank", (4, 6), q=4, niter=3),
    lowrank("svd_lowrank", (2, 6, 4), q=2),
    lowrank("pca_lowrank", (8, 5)),
    lowrank("pca_lowrank", (8, 5), q=3, center=False),
    same("frobenius_norm", quiet(lambda x: lib_of(x).frobenius_norm(x, (0, 2), True)),
         lambda dt, g: ((randn(3, 4, 5, gen=g, dtype=dt),), {})),
    same("frobenius_norm-all", quiet(lambda x: lib_of(x).frobenius_norm(x, ())),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {})),
    same("nuclear_norm", quiet(lambda x: lib_of(x).nuclear_norm(x)),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt),), {})),
    same("nuclear_norm-batched", quiet(lambda x: lib_of(x).nuclear_norm(x)),
         lambda dt, g: ((randn(2, 4, 3, gen=g, dtype=dt),), {})),
    same("nuclear_norm-dim", quiet(lambda x: lib_of(x).nuclear_norm(x, (0, 2), True)),
         lambda dt, g: ((randn(4, 2, 3, gen=g, dtype=dt),), {})),
    same("norm_except_dim-0", lambda v: lib_of(v).norm_except_dim(v, 2, 0),
         lambda dt, g: ((randn(4, 3, 2, gen=g, dtype=dt),), {})),
    same("norm_except_dim-last-pow3", lambda v: lib_of(v).norm_except_dim(v, 3, 2),
         lambda dt, g: ((randn(4, 3, 2, gen=g, dtype=dt),), {})),
    same("norm_except_dim-minus1", lambda v: lib_of(v).norm_except_dim(v, 2, -1),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt),), {})),
    same("norm_except_dim-minus2", lambda v: lib_of(v).norm_except_dim(v, 2, -2),
         lambda dt, g: ((randn(4, 3, 2, gen=g, dtype=dt),), {})),
    same("lu", quiet(lambda A: lib_of(A).lu(A)), lambda dt, g: ((randn(2, 4, 4, gen=g, dtype=dt),), {})),
    same("lu-infos", quiet(lambda A: lib_of(A).lu(A, get_infos=True)), lambda dt, g: ((randn(3, 3, gen=g, dtype=dt),), {})),
    same("Tensor.lu", quiet(lambda A: A.lu()), lambda dt, g: ((randn(3, 3, gen=g, dtype=dt),), {})),
    ctc(0), ctc(1), ctc(2),
    same("triplet_margin_loss-sum", lambda a, p, n: lib_of(a).triplet_margin_loss(a, p, n, 1.0, 2.0, 1e-6, True, 2),
         lambda dt, g: (tuple(randn(4, 3, gen=g, dtype=dt) for _ in range(3)), {})),
    same("hinge_embedding_loss-none", lambda x, t: lib_of(x).hinge_embedding_loss(x, t, 0.5, 0),
         lambda dt, g: ((randn(5, gen=g, dtype=dt), torch.tensor([1, -1, 1, -1, -1])), {})),
    bag(0), bag(1), bag(2),
    same("max_pool3d", lambda x: lib_of(x).max_pool3d(x, 2, (), 0, 1, True),
         lambda dt, g: ((torch.randperm(2 * 2 * 3 * 3 * 3, generator=g).to(dt).reshape(2, 2, 3, 3, 3),), {})),
    same("conv_transpose3d", lambda x, w: lib_of(x).conv_transpose3d(x, w, None, 2, 1, 1),
         lambda dt, g: ((randn(3, 3, 2, 3, 2, gen=g, dtype=dt), randn(3, 3, 2, 2, 2, gen=g, dtype=dt)), {})),
    same("channel_shuffle", lambda x: lib_of(x).channel_shuffle(x, 3),
         lambda dt, g: ((randn(2, 6, 2, gen=g, dtype=dt),), {})),
    same("native_channel_shuffle", lambda x: lib_of(x).native_channel_shuffle(x, 2),
         lambda dt, g: ((randn(1, 4, 3, gen=g, dtype=dt),), {}), grad=False),
    same("affine_grid_generator", lambda th: lib_of(th).affine_grid_generator(th, [2, 1, 3, 4], False),
         lambda dt, g: ((randn(2, 2, 3, gen=g, dtype=dt),), {})),
    grid("grid_sampler", False, 0, 0, False), grid("grid_sampler_2d", False, 1, 1, True),
    grid("grid_sampler_2d", False, 2, 2, False), grid("grid_sampler_3d", True, 0, 1, True),
    grid("grid_sampler", True, 0, 2, False),
    conv(False), conv(True), conv(False, groups=2),
    cell_case("lstm_cell", 4, lstm=True), cell_case("gru_cell", 3), cell_case("rnn_tanh_cell", 1),
    cell_case("rnn_relu_cell", 1, bias=False), cell_case("gru_cell", 3, bias=False),
    rnn_case("lstm"), rnn_case("gru", layers=1, bidirectional=False, batch_first=True),
    rnn_case("rnn_tanh", bias=False), rnn_case("rnn_relu", layers=1, batch_first=True),
    same("conv_tbc", lambda x, w, b: lib_of(x).conv_tbc(x, w, b, 1),
         lambda dt, g: ((randn(7, 3, 3, gen=g, dtype=dt), randn(3, 3, 4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {})),
    same("nn.functional.conv_tbc", lambda x, w, b: lib_of(x).nn.functional.conv_tbc(x, w, b, 2),
         lambda dt, g: ((randn(6, 2, 3, gen=g, dtype=dt), randn(2, 3, 5, gen=g, dtype=dt), randn(5, gen=g, dtype=dt)), {})),
    same("orgqr", lambda a, tau: lib_of(a).orgqr(a, tau), _householder),
    same("geqrf", lambda a: lib_of(a).geqrf(a), lambda dt, g: ((randn(3, 5, 3, gen=g, dtype=dt),), {}), grad=False),
    same("Tensor.geqrf", lambda a: a.geqrf(), lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {}), grad=False),
    same("ormqr-left", lambda a, tau, c: lib_of(a).ormqr(a, tau, c), _ormqr(True)),
    same("ormqr-left-T", lambda a, tau, c: lib_of(a).ormqr(a, tau, c, True, True), _ormqr(True)),
    same("ormqr-right", lambda a, tau, c: lib_of(a).ormqr(a, tau, c, False), _ormqr(False)),
    same("Tensor.ormqr-right-T", lambda a, tau, c: a.ormqr(tau, c, False, True), _ormqr(False)),
    same("Tensor.orgqr", lambda a, tau: a.orgqr(tau), _householder),
    same("view_as_real_copy", lambda z: lib_of(z).view_as_real_copy(z),
         lambda dt, g: ((torch.complex(randn(3, 2, gen=g, dtype=dt), randn(3, 2, gen=g, dtype=dt)),), {})),
    # (torch's view_as_complex_copy has no derivative; holoflow's is view_as_complex's, cloned)
    same("view_as_complex_copy", lambda x: lib_of(x).view_as_complex_copy(x),
         lambda dt, g: ((randn(3, 2, gen=g, dtype=dt),), {}), grad=False),
    same("native_layer_norm", lambda x, w, b: lib_of(x).native_layer_norm(x, [4, 5], w, b, 1e-5),
         lambda dt, g: ((randn(3, 4, 5, gen=g, dtype=dt), randn(4, 5, gen=g, dtype=dt), randn(4, 5, gen=g, dtype=dt)),
                        {})),
    same("native_layer_norm-noaffine", lambda x: lib_of(x).native_layer_norm(x, [5], None, None, 1e-3),
         lambda dt, g: ((randn(3, 4, 5, gen=g, dtype=dt),), {})),
    same("native_group_norm", lambda x, w, b: lib_of(x).native_group_norm(x, w, b, 3, 4, 6, 2, 1e-5),
         lambda dt, g: ((randn(3, 4, 2, 3, gen=g, dtype=dt), randn(4, gen=g, dtype=dt), randn(4, gen=g, dtype=dt)), {}),
         atol=1e-4, rtol=1e-4),
    same("native_batch_norm-nostats", lambda x, w, b: lib_of(x).native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5),
         _bn_inputs),
    Case("native_dropout", lambda x: flow.native_dropout(x, 0.3, True), lambda x: torch.native_dropout(x, 0.3, True),
         lambda dt, g: ((randn(4, 6, gen=g, dtype=dt),), {}), random=True),
    Case("native_dropout-eval", lambda x: flow.native_dropout(x, 0.3, False), lambda x: torch.native_dropout(x, 0.3, False),
         lambda dt, g: ((randn(4, 6, gen=g, dtype=dt),), {})),
    Case("feature_dropout", lambda x: flow.feature_dropout(x, 0.4, True), lambda x: torch.feature_dropout(x, 0.4, True),
         lambda dt, g: ((randn(3, 4, 2, 2, gen=g, dtype=dt),), {}), random=True),
    Case("feature_dropout-eval", lambda x: flow.feature_dropout(x, 0.4, False),
         lambda x: torch.feature_dropout(x, 0.4, False), lambda dt, g: ((randn(3, 4, 2, gen=g, dtype=dt),), {})),
]

globals().update(parametrize(CASES))


def test_feature_dropout_inplace_matches_torch():
    x = torch.randn(4, 5, 3)
    fx = flow.from_torch(x.clone())
    flow.manual_seed(7)
    out = flow.feature_dropout_(fx, 0.5, True)
    torch.manual_seed(7)
    want = torch.feature_dropout_(x, 0.5, True)
    assert out is fx
    torch.testing.assert_close(fx.to_torch(), want)


def test_embedding_bag_bookkeeping_outputs_match_torch():
    w = torch.randn(6, 3)
    idx, off = torch.tensor([0, 2, 4, 5, 1]), torch.tensor([0, 2, 2])
    for mode in (0, 1, 2):
        want = torch.embedding_bag(w, idx, off, False, mode)
        got = flow.embedding_bag(flow.from_torch(w), flow.from_torch(idx), flow.from_torch(off), False, mode)
        assert len(got) == 4
        for g, t in zip(got, want):
            assert g.dtype == flow.from_torch(t).dtype and tuple(g.shape) == tuple(t.shape)
            torch.testing.assert_close(g.to_torch(), t)


def test_svd_lowrank_recovers_low_rank_matrix():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(9, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 7, generator=g, dtype=torch.float64)
    U, S, V = flow.svd_lowrank(flow.from_torch(A), q=2)
    torch.testing.assert_close(S.to_torch(), torch.linalg.svdvals(A)[:2])
    torch.testing.assert_close((U.to_torch() * S.to_torch()) @ V.to_torch().T, A)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_segment_reduce_grad_matches_torch_with_ties(reduce):
    data = torch.tensor([[1.0, 2.0], [1.0, 0.5], [3.0, 3.0], [0.0, -1.0]], dtype=torch.float64)
    lengths = torch.tensor([2, 2])
    t = data.clone().requires_grad_()
    f = flow.from_torch(data.clone()).requires_grad_()
    torch.segment_reduce(t, reduce, lengths=lengths).pow(2).sum().backward()
    flow.segment_reduce(f, reduce, lengths=flow.from_torch(lengths)).pow(2).sum().backward()
    torch.testing.assert_close(f.grad.to_torch(), t.grad)


ERRORS = {
    "segment_reduce-bad-reduce": lambda lib: lib.segment_reduce(lib.ones(3), "median", lengths=lib.tensor([3])),
    "segment_reduce-lengths-sum": lambda lib: lib.segment_reduce(lib.ones(3, 2), "sum", lengths=lib.tensor([2, 2])),
    "segment_reduce-axis": lambda lib: lib.segment_reduce(lib.ones(3, 2), "sum", lengths=lib.tensor([1, 1]), axis=1),
    "frobenius_norm-3dims": lambda lib: lib.frobenius_norm(lib.ones(2, 2, 2), (0, 1, 2)),
    "frobenius_norm-int": lambda lib: lib.frobenius_norm(lib.ones(3, dtype=lib.int64), (0,)),
    "matrix_rank-removed": lambda lib: lib.matrix_rank(lib.ones(2, 2)),
    "solve-removed": lambda lib: lib.solve(lib.ones(2, 2), lib.ones(2, 2)),
    "eig-removed": lambda lib: lib.eig(lib.ones(2, 2)),
    "lstsq-removed": lambda lib: lib.lstsq(lib.ones(2, 2), lib.ones(2, 2)),
    "symeig-removed": lambda lib: lib.symeig(lib.ones(2, 2)),
    "Tensor.eig-removed": lambda lib: lib.ones(2, 2).eig(),
    "Tensor.solve-removed": lambda lib: lib.ones(2, 2).solve(lib.ones(2, 2)),
    "Tensor.lstsq-removed": lambda lib: lib.ones(2, 2).lstsq(lib.ones(2, 2)),
    "Tensor.symeig-removed": lambda lib: lib.ones(2, 2).symeig(),
    "feature_dropout-1d": lambda lib: lib.feature_dropout(lib.ones(3), 0.5, True),
    "range-bad-step": lambda lib: lib.range(0, 3, -1),
    "ctc_loss-str-reduction": lambda lib: lib.ctc_loss(lib.zeros(3, 1, 2), lib.ones(1, 1, dtype=lib.long), [3], [1],
                                                       0, "mean"),
    "pca_lowrank-big-q": lambda lib: lib.pca_lowrank(lib.ones(3, 3), q=4),
    "svd_lowrank-vector": lambda lib: lib.svd_lowrank(lib.ones(3), q=1),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_have_torchs_class_and_name_holoflow(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        err = error_like_torch(ERRORS[name], name)
    assert "holoflow" in str(err)


def test_lu_of_singular_matrix_reports_in_infos_like_torch():
    A = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = torch.lu(A, get_infos=True)
        got = flow.lu(flow.from_torch(A), get_infos=True)
        plain = flow.lu(flow.from_torch(A))   # no error either, as torch.lu
    for g, t in zip(got, want):
        torch.testing.assert_close(g.to_torch(), t)
    assert len(plain) == 2 and int(got[2]) == int(want[2]) > 0


def test_svd_lowrank_q_above_min_dim_is_clipped_like_torch():
    A = torch.randn(3, 4, dtype=torch.float64)
    torch.manual_seed(0)
    want = torch.svd_lowrank(A, q=5)
    flow.manual_seed(0)
    got = flow.svd_lowrank(flow.from_torch(A), q=5)
    for g, t in zip(got, want):
        torch.testing.assert_close(g.to_torch(), t)


def test_ctc_loss_with_tensor_lengths_matches_torch():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(6, 3, 4, generator=g, dtype=torch.float64).log_softmax(-1)
    t, il, tl = torch.randint(1, 4, (3, 3), generator=g), torch.tensor([6, 5, 6]), torch.tensor([3, 2, 1])
    tlp = lp.clone().requires_grad_()
    flp = flow.from_torch(lp.clone()).requires_grad_()
    want = torch.ctc_loss(tlp, t, il, tl, 0, 2, True)
    got = flow.ctc_loss(flp, flow.from_torch(t), flow.from_torch(il), flow.from_torch(tl), 0, 2, True)
    torch.testing.assert_close(got.to_torch(), want.detach())
    want.backward()
    got.backward()
    torch.testing.assert_close(flp.grad.to_torch(), tlp.grad)


def test_from_file_maps_the_file_like_torch(tmp_path):
    path = str(tmp_path / "data.bin")
    torch.arange(6, dtype=torch.float32).numpy().tofile(path)
    got = flow.from_file(path, shared=True, size=6, dtype=flow.float32)
    want = torch.from_file(path, shared=True, size=6, dtype=torch.float32)
    assert got.dtype is flow.float32
    torch.testing.assert_close(got.to_torch(), want)
    got[0] = 42.0   # shared: the write reaches the file
    assert torch.from_file(path, shared=False, size=6, dtype=torch.float32)[0].item() == 42.0
    with pytest.raises(RuntimeError) as t_err:
        torch.from_file(path, shared=False, size=100, dtype=torch.float32)
    with pytest.raises(type(t_err.value), match="holoflow"):
        flow.from_file(path, shared=False, size=100, dtype=flow.float32)


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_with_running_stats_matches_torch(training):
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((4, 3, 5), (3,), (3,)))
    rm, rv = torch.randn(3, generator=g, dtype=torch.float64), torch.rand(3, generator=g, dtype=torch.float64) + 0.5
    t_in = [v.clone().requires_grad_() for v in (x, w, b)]
    f_in = [flow.from_torch(v.clone()).requires_grad_() for v in (x, w, b)]
    t_rm, t_rv = rm.clone(), rv.clone()
    f_rm, f_rv = flow.from_torch(rm.clone()), flow.from_torch(rv.clone())
    want = torch.native_batch_norm(*t_in, t_rm, t_rv, training, 0.1, 1e-5)
    got = flow.native_batch_norm(*f_in, f_rm, f_rv, training, 0.1, 1e-5)
    for gv, tv in zip(got, want):
        assert tuple(gv.shape) == tuple(tv.shape) and gv.requires_grad == tv.requires_grad
        torch.testing.assert_close(gv.to_torch().detach(), tv.detach())
    torch.testing.assert_close(f_rm.to_torch(), t_rm)   # the running stats moved (or not) alike
    torch.testing.assert_close(f_rv.to_torch(), t_rv)
    up = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    want[0].backward(up)
    got[0].backward(flow.from_torch(up))
    for fv, tv in zip(f_in, t_in):
        torch.testing.assert_close(fv.grad.to_torch(), tv.grad)


def test_geqrf_backward_raises_like_torch():
    a = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(NotImplementedError) as t_err:
        torch.geqrf(a.clone().requires_grad_())[0].sum().backward()
    with pytest.raises(type(t_err.value), match="holoflow.geqrf"):
        flow.geqrf(flow.from_torch(a).requires_grad_())[0].sum().backward()
