"""nn.utils against torch.nn.utils: BatchNorm folding (fusion), conv weight memory formats,
skip_init, the deprecated clip_grad_norm and stateless.functional_call (with their FutureWarnings),
and torch's submodule names (fusion, memory_format, convert_parameters, stateless, init, clip_grad)."""
from __future__ import annotations

import importlib
import types
import warnings

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, S


def _twin(tm: torch.nn.Module, fm: flow.nn.Module) -> flow.nn.Module:
    """``fm`` holding ``tm``'s parameters and buffers."""
    fm.load_state_dict({k: flow.from_torch(v.detach().clone()) for k, v in tm.state_dict().items()})
    return fm


def _stats(bn: torch.nn.Module, seed: int) -> None:
    """Running statistics and affine parameters away from their defaults."""
    g = torch.Generator().manual_seed(seed)
    n = bn.num_features
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(n, generator=g, dtype=bn.running_mean.dtype))
        bn.running_var.copy_(torch.rand(n, generator=g, dtype=bn.running_var.dtype) + 0.5)
        if bn.weight is not None:
            bn.weight.copy_(torch.randn(n, generator=g, dtype=bn.weight.dtype))
            bn.bias.copy_(torch.randn(n, generator=g, dtype=bn.bias.dtype))


CONV_CASES = [
    ("Conv2d", (3, 4, 3), {}, "BatchNorm2d", {}, False, (2, 3, 6, 6)),
    ("Conv2d", (3, 4, 1), dict(bias=False), "BatchNorm2d", dict(affine=False), False, (2, 3, 5, 5)),
    ("Conv1d", (2, 5, 3), {}, "BatchNorm1d", dict(eps=1e-3), False, (2, 2, 7)),
    ("Conv3d", (2, 3, 2), dict(bias=False), "BatchNorm3d", {}, False, (1, 2, 4, 4, 4)),
    ("ConvTranspose2d", (3, 4, 3), dict(stride=2), "BatchNorm2d", {}, True, (2, 3, 4, 4)),
    ("ConvTranspose1d", (4, 6, 2), dict(padding=1), "BatchNorm1d", {}, True, (1, 4, 5)),
    ("Conv2d", (3, 4, 3), dict(dtype=torch.float64), "BatchNorm2d", dict(dtype=torch.float64), False, (2, 3, 6, 6)),
]


@pytest.mark.parametrize("conv,cargs,ckw,bn,bkw,transpose,shape", CONV_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CONV_CASES)])
def test_fuse_conv_bn_eval_like_torch(conv, cargs, ckw, bn, bkw, transpose, shape):
    torch.manual_seed(0)
    tc, tb = getattr(torch.nn, conv)(*cargs, **ckw).eval(), getattr(torch.nn, bn)(cargs[1], **bkw).eval()
    _stats(tb, 1)
    fkw = {k: (flow.float64 if v is torch.float64 else v) for k, v in ckw.items()}
    fbkw = {k: (flow.float64 if v is torch.float64 else v) for k, v in bkw.items()}
    fc = _twin(tc, getattr(flow.nn, conv)(*cargs, **fkw)).eval()
    fb = _twin(tb, getattr(flow.nn, bn)(cargs[1], **fbkw)).eval()
    want = torch.nn.utils.fuse_conv_bn_eval(tc, tb, transpose)
    got = flow.nn.utils.fuse_conv_bn_eval(fc, fb, transpose)
    assert type(got) is type(fc) and got is not fc
    assert isinstance(got.weight, flow.nn.Parameter) and isinstance(got.bias, flow.nn.Parameter)
    for name in ("weight", "bias"):
        w, g = getattr(want, name), getattr(got, name)
        assert g.dtype == flow.from_torch(w.detach()).dtype and g.requires_grad == w.requires_grad
        np.testing.assert_array_equal(g.detach().numpy(), w.detach().numpy(), err_msg=name)
    assert (fc.bias is None) == (tc.bias is None)   # the original is left alone
    x = np.random.default_rng(2).standard_normal(shape)
    tx = torch.tensor(x, dtype=tc.weight.dtype)
    np.testing.assert_allclose(got(flow.from_torch(tx)).detach().numpy(), tb(tc(tx)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("features", [4, 1])
def test_fuse_linear_bn_eval_like_torch(features):
    torch.manual_seed(0)
    tl, tb = torch.nn.Linear(3, 4).eval(), torch.nn.BatchNorm1d(features).eval()
    _stats(tb, 3)
    fl, fb = _twin(tl, flow.nn.Linear(3, 4)).eval(), _twin(tb, flow.nn.BatchNorm1d(features)).eval()
    want, got = torch.nn.utils.fuse_linear_bn_eval(tl, tb), flow.nn.utils.fuse_linear_bn_eval(fl, fb)
    assert type(got) is flow.nn.Linear and got is not fl
    for name in ("weight", "bias"):
        w, g = getattr(want, name), getattr(got, name)
        assert isinstance(g, flow.nn.Parameter) and g.requires_grad == w.requires_grad
        np.testing.assert_array_equal(g.detach().numpy(), w.detach().numpy(), err_msg=name)
    np.testing.assert_array_equal(fl.weight.detach().numpy(), tl.weight.detach().numpy())


def test_fuse_weights_functions_like_torch():
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3, 2, 2), (4,), (4,), (4,), (4,), (4,)]]
    arrays[3] = np.abs(arrays[3]) + 0.1   # (a variance)
    t = [torch.tensor(a) for a in arrays]
    f = [flow.tensor(a) for a in arrays]
    t[0].requires_grad_(True)
    f[0].requires_grad_(True)
    for conv_b, bn_w, bn_b in [(1, 4, 5), (None, None, None), (1, None, 5)]:
        pick = lambda xs, i: None if i is None else xs[i]  # noqa: E731
        want = torch.nn.utils.fuse_conv_bn_weights(t[0], pick(t, conv_b), t[2], t[3], 1e-5, pick(t, bn_w), pick(t, bn_b))
        got = flow.nn.utils.fuse_conv_bn_weights(f[0], pick(f, conv_b), f[2], f[3], 1e-5, pick(f, bn_w), pick(f, bn_b))
        for w, g in zip(want, got):
            assert isinstance(g, flow.nn.Parameter) and g.requires_grad == w.requires_grad and g.is_leaf
            np.testing.assert_array_equal(g.detach().numpy(), w.detach().numpy())
    lw = [torch.tensor(arrays[0][:, :, 0, 0]), flow.tensor(arrays[0][:, :, 0, 0])]
    want = torch.nn.utils.fuse_linear_bn_weights(lw[0].double(), None, *t[2:4], 1e-3, t[4], t[5])
    got = flow.nn.utils.fuse_linear_bn_weights(lw[1].double(), None, *f[2:4], 1e-3, f[4], f[5])
    for w, g in zip(want, got):
        assert g.dtype == flow.float64 and w.dtype == torch.float64
        np.testing.assert_array_equal(g.detach().numpy(), w.detach().numpy())


def test_fusion_refusals_like_torch():
    for lib in (torch, flow):
        prefix = "^holoflow.nn.utils.fuse_[a-z_]+: " if lib is flow else ""
        conv, bn = lib.nn.Conv2d(2, 3, 1), lib.nn.BatchNorm2d(3)
        with pytest.raises(AssertionError, match=prefix + "Fusion only for eval!"):
            lib.nn.utils.fuse_conv_bn_eval(conv, bn)
        with pytest.raises(AssertionError, match=prefix + "bn.running_mean and bn.running_var must not be None"):
            lib.nn.utils.fuse_conv_bn_eval(conv.eval(), lib.nn.BatchNorm2d(3, track_running_stats=False).eval())
        with pytest.raises(AssertionError, match=prefix + "To fuse, linear.out_features == bn.num_features"):
            lib.nn.utils.fuse_linear_bn_eval(lib.nn.Linear(2, 3).eval(), lib.nn.BatchNorm1d(2).eval())
        with pytest.raises(AssertionError, match=prefix + "Fusion only for eval!"):
            lib.nn.utils.fuse_linear_bn_eval(lib.nn.Linear(2, 3), lib.nn.BatchNorm1d(3).eval())


def _global_fuse(rank: int, sbp) -> np.ndarray:
    place = flow.placement("cpu", [0, 1])
    rng = np.random.default_rng(5)
    w, rm, rv, bw, bb = (rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (4,), (4,), (4,), (4,)])
    rv = np.abs(rv) + 0.1
    g = lambda a, nd: flow.tensor(a).to_global(place, B).to_global(sbp=nd)  # noqa: E731
    fw, fb = flow.nn.utils.fuse_linear_bn_weights(g(w, sbp), None, g(rm, B), g(rv, B), 1e-5, g(bw, B), g(bb, B))
    assert fw.is_global and isinstance(fw, flow.nn.Parameter)
    return fw.detach().to_global(sbp=B).to_local().numpy(), fb.detach().to_global(sbp=B).to_local().numpy()


@pytest.mark.parametrize("sbp", [S(0), S(1)], ids=["S0", "S1"])
def test_fuse_weights_of_global_tensors(sbp):
    rng = np.random.default_rng(5)
    w, rm, rv, bw, bb = (torch.tensor(rng.standard_normal(s).astype(np.float32)) for s in [(4, 3), (4,), (4,), (4,), (4,)])
    want = torch.nn.utils.fuse_linear_bn_weights(w, None, rm, rv.abs() + 0.1, 1e-5, bw, bb)
    for got in world.simulate(2, lambda r: _global_fuse(r, sbp)):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b.detach().numpy(), rtol=1e-6, atol=1e-7)


# -- memory formats ------------------------------------------------------------------------------

def _convs(lib):
    return lib.nn.Sequential(lib.nn.Conv2d(3, 4, 3), lib.nn.Sequential(lib.nn.ConvTranspose2d(4, 2, 1)),
                             lib.nn.Conv2d(2, 2, 1), lib.nn.Conv1d(2, 2, 3), lib.nn.Conv3d(2, 3, 2),
                             lib.nn.ConvTranspose3d(3, 1, 1), lib.nn.Linear(2, 2))


@pytest.mark.parametrize("fn,fmt", [("convert_conv2d_weight_memory_format", "channels_last"),
                                    ("convert_conv2d_weight_memory_format", "contiguous_format"),
                                    ("convert_conv3d_weight_memory_format", "channels_last_3d"),
                                    ("convert_conv3d_weight_memory_format", "contiguous_format")])
def test_convert_conv_weight_memory_format_like_torch(fn, fmt):
    torch.manual_seed(0)
    tm = _convs(torch)
    fm = _twin(tm, _convs(flow))
    before = {k: v.detach().numpy().copy() for k, v in fm.state_dict().items()}
    for m, lib in ((tm, torch), (fm, flow)):
        if fmt == "contiguous_format":   # from channels_last first, so the conversion changes something
            lib.nn.utils.convert_conv2d_weight_memory_format(m, lib.channels_last)
            lib.nn.utils.convert_conv3d_weight_memory_format(m, lib.channels_last_3d)
        assert getattr(lib.nn.utils, fn)(m, getattr(lib, fmt)) is m
    for (k, tv), (fk, fv) in zip(tm.state_dict().items(), fm.state_dict().items()):
        assert k == fk and fv.stride() == tv.stride(), k
        np.testing.assert_array_equal(fv.numpy(), before[k])
    assert isinstance(fm[0].weight, flow.nn.Parameter) and fm[0].weight.requires_grad


def test_convert_memory_format_refusals_like_torch():
    for lib in (torch, flow):
        prefix = "holoflow.nn.utils.convert_conv2d_weight_memory_format: " if lib is flow else ""
        with pytest.raises(RuntimeError, match=prefix + "Unsupported memory format"):
            lib.nn.utils.convert_conv2d_weight_memory_format(lib.nn.Conv2d(1, 1, 1), lib.preserve_format)
        with pytest.raises(RuntimeError, match=prefix + "required rank 5 tensor"):
            lib.nn.utils.convert_conv2d_weight_memory_format(lib.nn.Conv2d(1, 1, 1), lib.channels_last_3d)


def _global_memory_format(rank: int) -> tuple:
    place = flow.placement("cpu", [0, 1])
    flow.manual_seed(0)
    m = flow.nn.Conv2d(4, 4, 3).to_global(place, B)
    m.weight = flow.nn.Parameter(m.weight.detach().to_global(sbp=S(0)))
    flow.nn.utils.convert_conv2d_weight_memory_format(m, flow.channels_last)
    return m.weight.is_global, m.weight.sbp, m.weight.to_local().is_contiguous(memory_format=flow.channels_last)


def test_convert_memory_format_keeps_global_weights_global():
    for is_global, sbp, channels_last in world.simulate(2, _global_memory_format):
        assert is_global and sbp == (S(0),) and channels_last


# -- skip_init -----------------------------------------------------------------------------------

def test_skip_init_like_torch():
    for lib in (torch, flow):
        state = torch.get_rng_state()
        m = lib.nn.utils.skip_init(lib.nn.Linear, 3, 4, bias=True, dtype=lib.float64)
        assert torch.equal(torch.get_rng_state(), state)   # no initialiser ran
        assert type(m) is lib.nn.Linear and tuple(m.weight.shape) == (4, 3)
        assert m.weight.dtype == lib.float64 and m.weight.device.type == "cpu"
        assert isinstance(m.weight, lib.nn.Parameter) and m.weight.requires_grad
        m2 = lib.nn.utils.skip_init(lib.nn.Conv2d, 2, 3, 3, device="meta")
        assert m2.weight.device.type == "meta"


def test_skip_init_refusals_like_torch():
    class NoDevice(torch.nn.Module):
        def __init__(self, n):
            super().__init__()

    class FNoDevice(flow.nn.Module):
        def __init__(self, n):
            super().__init__()
    for lib, nodev in ((torch, NoDevice), (flow, FNoDevice)):
        prefix = "^holoflow.nn.utils.skip_init: " if lib is flow else ""
        with pytest.raises(RuntimeError, match=prefix + "Expected a Module"):
            lib.nn.utils.skip_init(dict)
        with pytest.raises(RuntimeError, match=prefix + "Module must support a 'device' arg"):
            lib.nn.utils.skip_init(nodev, 3)


# -- deprecated spellings ------------------------------------------------------------------------

def _warned(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(*args, **kwargs)
    return out, [(w.category, str(w.message), w.filename) for w in caught]


def test_clip_grad_norm_is_deprecated_alias_like_torch():
    rng = np.random.default_rng(6)
    grads = [rng.standard_normal(s).astype(np.float32) * 3 for s in [(3, 4), (5,)]]
    outs = []
    for lib in (torch, flow):
        ps = [lib.nn.Parameter(lib.zeros(*g.shape)) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = lib.tensor(g)
        total, caught = _warned(lib.nn.utils.clip_grad_norm, ps, 1.0, norm_type=3.0)
        assert [c[0] for c in caught] == [FutureWarning] and caught[0][2] == __file__
        name = lib.__name__
        assert caught[0][1] == f"`{name}.nn.utils.clip_grad_norm` is now deprecated in favor of `{name}.nn.utils.clip_grad_norm_`."
        outs.append((float(total), [p.grad.numpy() for p in ps]))
    assert outs[1][0] == pytest.approx(outs[0][0], rel=1e-6)
    for a, b in zip(outs[1][1], outs[0][1]):
        np.testing.assert_allclose(a, b, rtol=1e-6)


class _Tied:
    """A module whose two submodules share one Linear (tied weights), built in either library."""

    @staticmethod
    def make(lib):
        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = lib.nn.Linear(2, 2)
                self.b = self.a
                self.register_buffer("scale", lib.tensor([2.0]))

            def forward(self, x, shift=0.0):
                return self.a(x) * self.scale + self.b(x) + shift
        return M()


def test_stateless_functional_call_like_torch():
    torch.manual_seed(0)
    tm = _Tied.make(torch)
    fm = _twin(tm, _Tied.make(flow))
    new = {"a.weight": torch.ones(2, 2), "scale": torch.tensor([0.5])}
    fnew = {k: flow.from_torch(v) for k, v in new.items()}
    x = torch.tensor([[1.0, -2.0]])
    w0 = tm.a.weight.detach().numpy().copy()
    tm2 = _Tied.make(torch)
    tm2.load_state_dict(tm.state_dict())
    want, tcaught = _warned(torch.nn.utils.stateless.functional_call, tm, new, x, {"shift": 1.0})
    got, fcaught = _warned(flow.nn.utils.stateless.functional_call, fm, fnew, flow.from_torch(x), {"shift": 1.0})
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6)
    assert [c[0] for c in fcaught] == [c[0] for c in tcaught] == [FutureWarning]
    assert fcaught[0][1].startswith("`holoflow.nn.utils.stateless.functional_call` is deprecated") and \
        "holoflow.func.functional_call" in fcaught[0][1] and fcaught[0][2] == __file__
    # restored (torch's restore order leaves a Linear registered under two names holding the
    # replacement: a torch bug holoflow does not copy)
    np.testing.assert_array_equal(fm.a.weight.detach().numpy(), w0)
    assert fm.scale.item() == 2.0
    # untied: only the name given changes (one Linear under two names: the last write wins, as torch)
    with pytest.warns(FutureWarning):
        want = torch.nn.utils.stateless.functional_call(tm2, new, (x,), tie_weights=False)
    with pytest.warns(FutureWarning):
        got = flow.nn.utils.stateless.functional_call(fm, fnew, (flow.from_torch(x),), tie_weights=False)
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-6)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_stateless_functional_call_refusals_like_torch():
    for lib in (torch, flow):
        call = lib.nn.utils.stateless.functional_call
        m = _Tied.make(lib)
        x = lib.ones(1, 2)
        with pytest.raises(ValueError, match="multiple values for keys \\['a.weight', 'b.weight'\\], which are tied"):
            call(m, {"a.weight": lib.ones(2, 2), "b.weight": lib.zeros(2, 2)}, x)
        with pytest.raises(RuntimeError, match="(?i)missing key"):
            call(m, {"a.weight": lib.ones(2, 2)}, x, strict=True)
        with pytest.raises(RuntimeError, match="can't be used with nn.DataParallel module"):
            call(lib.nn.DataParallel(lib.nn.Linear(2, 2)), {}, x)
    # holoflow.func.functional_call shares the machinery: torch.func's error for tied values too
    with pytest.raises(ValueError, match="^holoflow.func.functional_call: functional_call got multiple values"):
        flow.func.functional_call(_Tied.make(flow), {"a.weight": flow.ones(2, 2), "b.weight": flow.zeros(2, 2)},
                                  flow.ones(1, 2))
    with pytest.raises(ValueError, match="multiple values"):
        torch.func.functional_call(_Tied.make(torch), {"a.weight": torch.ones(2, 2), "b.weight": torch.zeros(2, 2)},
                                   torch.ones(1, 2))


# -- torch's submodule names ---------------------------------------------------------------------

def test_nn_utils_exposes_torch_submodules():
    for name in dir(torch.nn.utils):
        t = getattr(torch.nn.utils, name)
        if name.startswith("_"):
            continue
        assert hasattr(flow.nn.utils, name), name
        if isinstance(t, types.ModuleType):
            f = getattr(flow.nn.utils, name)
            assert isinstance(f, types.ModuleType), name
            assert importlib.import_module(f"holoflow.nn.utils.{name}") is f
            public = getattr(t, "__all__", None) or [n for n in dir(t) if not n.startswith("_") and callable(getattr(t, n))
                                                     and getattr(getattr(t, n), "__module__", "").startswith("torch.nn.utils")]
            missing = [n for n in public if not hasattr(f, n)]
            assert not missing, (name, missing)
    assert flow.nn.utils.convert_parameters.parameters_to_vector is flow.nn.utils.parameters_to_vector
    assert flow.nn.utils.init.skip_init is flow.nn.utils.skip_init


def test_transfer_parametrizations_and_params_like_torch():
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    class FDouble(flow.nn.Module):
        def forward(self, x):
            return x * 2
    out = []
    for lib, dbl in ((torch, Double), (flow, FDouble)):
        lib.manual_seed(0)
        src, dst = lib.nn.Linear(2, 3), lib.nn.Linear(2, 3)
        lib.nn.utils.parametrize.register_parametrization(src, "weight", dbl())
        lib.nn.utils.parametrize.register_parametrization(src, "bias", dbl())
        assert lib.nn.utils.parametrize.transfer_parametrizations_and_params(src, dst, "weight") is dst
        assert lib.nn.utils.parametrize.is_parametrized(dst, "weight")
        assert not lib.nn.utils.parametrize.is_parametrized(dst, "bias")
        assert dst.parametrizations.weight.original is src.parametrizations.weight.original
        fresh = lib.nn.Module()   # no such tensors yet: created, then parametrized
        lib.nn.utils.parametrize.transfer_parametrizations_and_params(src, fresh)
        out.append((dst.weight.detach().numpy(), fresh.bias.detach().numpy(), sorted(fresh.state_dict())))
    np.testing.assert_array_equal(out[1][0], out[0][0])
    np.testing.assert_array_equal(out[1][1], out[0][1])
    assert out[1][2] == out[0][2]
