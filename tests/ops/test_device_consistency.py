"""Every op-table case keeps its tensors on its inputs' device, forward and backward, without a GPU.

A CUDA run of the op tables (bench/gpu_check.py ``ops``) fails wherever a kernel, a grad rule, the
harness or a case's reference builds a tensor without ``device=`` (a CPU tensor then meets CUDA
ones). Two CPU proxies catch the same mistakes here:

1. ``meta`` inputs: :func:`harness.run_case` with every input on the meta device (shapes, dtypes
   and devices compared with torch, values not: meta tensors hold none). A CPU tensor meeting a
   meta one raises as it would meeting a CUDA one; an output or gradient on another device than
   torch's fails the comparison.
2. CPU inputs under ``torch.device("meta")`` as the default device: a factory call without
   ``device=`` then makes a meta tensor, which raises when it meets the CPU inputs. This pass runs
   on real data, so it also covers the cases that cannot run on meta (data-dependent shapes,
   value checks), and it catches a constant built on the CPU and copied over (``.to(device)``),
   which works on CUDA but costs a host-to-device copy per call.

Cases pass 1 cannot run are listed below by name with the reason (and checked to fail for that
reason only); pass 2 runs every case. A deliberate CPU tensor (ATen's packed-sequence
``batch_sizes``, ctc_loss's list lengths) is made with an explicit ``device="cpu"``.

Both passes run under :func:`cuda_rules`: checks CUDA makes and the CPU and meta kernels do not.
Without them the passes missed two classes of CUDA failures:

- a kernel without a device check on meta or CPU: torch's generated CUDA wrappers check that every
  tensor argument is on one device ("Expected all tensors to be on the same device"), the CPU and
  meta ones do not, and many meta kernels (``scatter_reduce``, ``bucketize``, ...) only compute
  shapes; a CPU index meeting meta inputs (pass 1), or a meta one meeting CPU inputs (pass 2),
  went through. :class:`OneDevice` is that check, for every aten op either pass dispatches;
- cuDNN's RNN backward needs the training forward (``train=True``: it keeps the reserve space the
  backward reads); ATen's CPU kernels ignore ``train`` when dropout is 0. :class:`RnnTrainFlag`
  rejects an RNN kernel called with ``train=False`` whose result is differentiated.
"""
from __future__ import annotations

import importlib
import pkgutil

import ops as ops_tests
import perf_paths
import pytest
import torch
from harness import F32, Case, leaves, run_case, to_flow

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import holoflow as flow

aten = torch.ops.aten

# ops that CUDA runs with arguments on two devices: copies between devices, indexing with CPU
# index tensors (moved over by ATen), and ctc_loss's lengths (read on the host; torch.ctc_loss
# passes them to its CUDA kernel as int lists, but under a Python dispatch mode it takes its
# tensor-subclass path, which hands _ctc_loss the tensors)
MIXED_DEVICES_OK = {aten.copy_, aten._to_copy, aten._copy_from, aten._copy_from_and_resize, aten.index,
                    aten.index_put, aten.index_put_, aten._index_put_impl_, aten._unsafe_index,
                    aten._unsafe_index_put, aten._ctc_loss}


class OneDevice(TorchDispatchMode):
    """Every aten op gets its tensors on one device, as torch's CUDA kernels require (their
    generated wrappers check it; the CPU and meta ones do not). A 0-d CPU tensor is a scalar that
    CUDA's elementwise kernels accept beside any device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket not in MIXED_DEVICES_OK:
            ts = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            devs = {str(t.device) for t in ts if t.dim() or t.device.type != "cpu"}
            if len(devs) > 1:
                raise RuntimeError(f"{func}: expected all tensors to be on the same device, got "
                                   + ", ".join(f"{tuple(t.shape)} on {t.device}" for t in ts)
                                   + " (CUDA's kernels reject this)")
        return func(*args, **kwargs)


_RNN = {torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh, torch._VF.rnn_relu}


class RnnTrainFlag(TorchFunctionMode):
    """torch's RNN kernels (``lstm``/``gru``/``rnn_tanh``/``rnn_relu``) get ``train=True`` wherever a
    backward may follow (grad mode on, a tensor argument requiring grad): cuDNN's backward raises
    after an inference forward ("cudnn RNN backward can only be called in training mode")."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RNN:
            packed = isinstance(args[3], (list, tuple))  # (data, batch_sizes, hx, params, ...) vs (input, hx, params, bool, ...)
            train = args[7 if packed else 6]
            diff = torch.is_grad_enabled() and any(
                t.requires_grad for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            if diff and not train:
                raise RuntimeError(f"torch.{func.__name__} with train=False and inputs that require grad: cuDNN's "
                                   f"backward would raise (\"cudnn RNN backward can only be called in training mode\")")
        return func(*args, **kwargs)


class cuda_rules:
    """Both checks, for the duration of a ``with`` block."""

    def __enter__(self):
        self.modes = [RnnTrainFlag(), OneDevice()]
        for m in self.modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self.modes):
            m.__exit__(*exc)
        return False

# Pass 1: cases whose kernels (holoflow's or torch's reference) need values meta tensors lack.
_NONZERO = "data-dependent output shape (the number of true mask elements / nonzeros): no meta kernel"
_ITEM = "reads a value with .item(): {}"
NEEDS_DATA = {
    "masked_select": _NONZERO,
    "masked_select-broadcast": _NONZERO,
    "masked_select_backward": _NONZERO,
    "index_backward-mask": _NONZERO,
    "nonzero": _NONZERO,
    "nonzero-0d": _NONZERO,
    # torch's gradient of the value counts each filled entry once through aten::_unique
    "index_fill-tensor-value": "torch's gradient of the value runs aten::_unique: no meta kernel",
    "index_fill_-tensor-value": "torch's gradient of the value runs aten::_unique: no meta kernel",
    "repeat_interleave-tensor": _ITEM.format("repeats must be >= 0 (as torch checks); the length is their sum"),
    "unique": "data-dependent output shape (the distinct values): no meta kernel",
    "one_hot-infer": _ITEM.format("num_classes=-1 is the largest index + 1"),
    "gaussian_nll_loss{'reduction': 'mean'}": _ITEM.format("var must be >= 0 (as torch checks)"),
    "gaussian_nll_loss{'reduction': 'sum'}": _ITEM.format("var must be >= 0 (as torch checks)"),
    "gaussian_nll_loss{'reduction': 'none'}": _ITEM.format("var must be >= 0 (as torch checks)"),
    "gaussian_nll_loss{'full': True}-var-short": _ITEM.format("var must be >= 0 (as torch checks)"),
    "gaussian_nll_loss{'eps': 0.8}-var-bcast": _ITEM.format("var must be >= 0 (as torch checks)"),
}
for _red in ("mean", "sum", "none"):
    for _shape in ("[4, 5]", "[0, 3]", "[3]"):
        NEEDS_DATA[f"binary_cross_entropy-{_red}{_shape}"] = _ITEM.format("the input must lie in [0, 1] (as torch checks)")
for _fn in ("mse_loss", "smooth_l1_loss", "smooth_l1_loss{'beta': 0.5}", "huber_loss{'delta': 0.7}"):
    NEEDS_DATA[f"{_fn}-mean[0, 3]"] = "torch's reference: its meta backward of an empty mean divides by 0 in Python"
NEEDS_DATA["binary_cross_entropy-weight"] = _ITEM.format("the input must lie in [0, 1] (as torch checks)")
for _name in ("cov", "cov-weights", "corrcoef"):
    NEEDS_DATA[_name] = "torch.cov's kernel compares values (aten::equal): no meta kernel"
NEEDS_DATA["isin-invert-unique"] = NEEDS_DATA["unique"]
NEEDS_DATA["unique_consecutive"] = NEEDS_DATA["unique_consecutive-dim"] = \
    "data-dependent output shape (the runs of equal values): no meta kernel"
for _name in ("lstsq[3, 3]", "lstsq[2, 4, 4]", "lstsq-tall-gelsd", "lstsq-gelss-rcond", "lstsq-gels"):
    NEEDS_DATA[_name] = "torch's reference: aten::linalg_lstsq has no meta kernel"
NEEDS_DATA["bincount"] = NEEDS_DATA["bincount-weights-minlength"] = \
    "data-dependent output shape (the largest value + 1): no meta kernel"
NEEDS_DATA["Tensor.bincount"] = NEEDS_DATA["bincount"]
for _name in ("combinations", "combinations-r3", "combinations-replacement", "combinations-r-too-large"):
    NEEDS_DATA[_name] = "torch's reference: torch.combinations runs aten::masked_select, which has no meta kernel"
_CTC = "aten::_ctc_loss has no meta kernel"
for _tag in ("{'reduction': 'mean'}-padded", "{'reduction': 'mean', 'blank': 0}-flat", "{'reduction': 'sum'}-padded",
             "{'reduction': 'sum', 'blank': 0}-flat", "{'reduction': 'none'}-padded",
             "{'reduction': 'none', 'blank': 0}-flat", "{'reduction': 'mean'}-lists",
             "{'reduction': 'none', 'zero_infinity': True}-zero-inf", "{'reduction': 'sum', 'blank': 4}-blank4"):
    NEEDS_DATA[f"ctc_loss{_tag}"] = _CTC
for _name in ("istft", "istft-batch-length", "istft-window-grad", "Tensor.istft"):
    NEEDS_DATA[_name] = "torch's reference: torch.istft checks the window envelope's values (aten::equal): no meta kernel"
for _name in ("cond-true", "cond-false"):
    NEEDS_DATA[_name] = _ITEM.format("the predicate picks the branch (torch.cond's eager run reads it too)")
for _name in ("histogramdd", "histogramdd-bins-range-density", "histogramdd-range-weight"):
    NEEDS_DATA[_name] = "torch's reference: aten::_histogramdd_bin_edges has no meta kernel"
NEEDS_DATA["histogramdd-edges"] = "torch's reference: aten::_histogramdd_from_bin_tensors has no meta kernel"
for _name in ("multi_margin_loss", "multi_margin_loss-p2-weight", "multi_margin_loss-1d-none"):
    NEEDS_DATA[_name] = "torch's reference: aten::multi_margin_loss_backward has no meta kernel"
for _name in ("multilabel_margin_loss", "multilabel_margin_loss-none", "multilabel_margin_loss-1d"):
    NEEDS_DATA[_name] = "torch's reference: aten::multilabel_margin_loss_backward has no meta kernel"
for _name in ("ctc_loss-0", "ctc_loss-1", "ctc_loss-2"):   # (torch.ctc_loss, the top-level spelling)
    NEEDS_DATA[_name] = _CTC
for _name in ("geqrf", "Tensor.geqrf"):
    NEEDS_DATA[_name] = "torch's reference: aten::geqrf has no meta kernel"
_FAKE_QUANT = "torch's reference: aten::fake_quantize_per_{}_affine_cachemask has no meta kernel"
for _qmin, _qmax in [(0, 255), (-128, 127), (-8, 7)]:
    for _scale, _zero in [(0.1, 0), (0.37, 5)]:
        NEEDS_DATA[f"fake_quantize_per_tensor-{_scale}-{_zero}-[{_qmin},{_qmax}]"] = _FAKE_QUANT.format("tensor")
        NEEDS_DATA[f"fake_quantize_per_tensor-tensor_qparams-{_scale}-{_zero}-[{_qmin},{_qmax}]"] = \
            "torch's reference: aten::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams has no meta kernel"
for _name in ("[4, 5, 3]-axis0", "[4, 5, 3]-axis1", "[4, 5, 3]-axis2", "[6]-axis0"):
    NEEDS_DATA[f"fake_quantize_per_channel-{_name}"] = _FAKE_QUANT.format("channel")
NEEDS_DATA["standard_gamma_grad"] = "aten::_standard_gamma_grad has no meta kernel (the op's shape rule serves traces)"
NEEDS_DATA["dirichlet_grad"] = "aten::_dirichlet_grad has no meta kernel (the op's shape rule serves traces)"


def _cases() -> list:
    out = []
    for pkg, prefix in ((ops_tests, "ops"), (perf_paths, "perf_paths")):
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("test_") or info.name == "test_device_consistency":
                continue
            mod = importlib.import_module(f"{prefix}.{info.name}")
            out += [c for c in getattr(mod, "CASES", ()) if not c.random]
    return out


CASES = _cases()


def _data_error(e: BaseException) -> bool:
    """A kernel that needs values: no meta kernel, a data-dependent shape or an .item()."""
    msg = str(e)
    return isinstance(e, NotImplementedError) or "item()" in msg or "data-dependent" in msg \
        or isinstance(e, ZeroDivisionError) or "no fake impl or Meta kernel" in msg


@pytest.mark.parametrize("case", [c for c in CASES if c.name not in NEEDS_DATA], ids=repr)
def test_on_meta_device(case):
    with cuda_rules():
        run_case(case, case.dtypes[0], device="meta")


@pytest.mark.parametrize("case", [c for c in CASES if c.name in NEEDS_DATA], ids=repr)
def test_needs_data_is_why_meta_fails(case):
    """The listed cases fail on meta for the listed reason, not for a device mismatch (a case that
    starts passing should leave the list)."""
    with pytest.raises(Exception) as info, cuda_rules():
        run_case(case, case.dtypes[0], device="meta")
    assert _data_error(info.value), f"{case.name}: {type(info.value).__name__}: {info.value}"


def test_needs_data_names_are_cases():
    assert not set(NEEDS_DATA) - {c.name for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_no_deviceless_tensors(case):
    """Forward and backward with CPU inputs, the default device meta: every tensor made without a
    device lands on meta and raises where it meets the inputs; outputs and grads stay on the CPU."""
    gen = torch.Generator().manual_seed(0)
    args, kwargs = case.make(case.dtypes[0], gen)
    fargs, fkw = to_flow(args, case.grad), to_flow(kwargs, case.grad)
    cpu = torch.device("cpu")
    with torch.device("meta"), cuda_rules():
        got = case.flow_fn(*fargs, **fkw)
        outs = [o for o in leaves(got) if o.requires_grad]
        ins = [x for x in leaves((fargs, fkw)) if x.requires_grad]
        grads = []
        if case.grad and outs and ins:
            ups = [flow.from_torch(torch.ones(o.shape, dtype=o.to_torch().dtype, device=cpu)) for o in outs]
            grads = flow.autograd.grad(outs, ins, ups, allow_unused=True)
    for i, t in enumerate(leaves(got)):
        if isinstance(t, flow.Tensor):
            assert t.to_torch().device == cpu, f"{case.name}: output {i} on {t.to_torch().device}"
    for i, g in enumerate(grads):
        assert g is None or g.to_torch().device == cpu, f"{case.name}: grad {i} on {g.to_torch().device}"


# -- constants a composite or grad rule builds from a Python value: inside nn.Graph's trace a
# tensor's data is meta, so they follow ``t.device`` (the real device), never ``t._data.device``
# (a meta constant holds no values and the trace rejects it).
def _row(L, x):
    """A Python list for holoflow (made into a tensor inside the op), the same values for torch."""
    row = [1.0, 2.0, 3.0, 4.0]
    return row if L is flow else torch.tensor(row, dtype=x.dtype)


def _setitem_list(L, x):
    y = x.clone()
    y[0] = _row(L, x)
    return y * x


GRAPH_EXPRS = {
    "rsub-float64": lambda L, x: 2.5 - x,
    "where-scalar": lambda L, x: L.where(x > 0.5, x, 0.25),
    "isin-number": lambda L, x: L.isin(3, (x * 4).long()).to(x.dtype) + x,
    "bucketize-number": lambda L, x: L.bucketize(0.3, x[0].sort().values).to(x.dtype) + x,
    "copy_-list": lambda L, x: x.detach().clone().copy_(_row(L, x)) * x,
    "getitem-list": lambda L, x: x[:, [1, 1, 3, 0]],
    "setitem-list": _setitem_list,
    "einsum-diag": lambda L, x: L.einsum("ii->i", x),
    "irfft": lambda L, x: L.fft.irfft(L.fft.rfft(x, dim=1), 4, dim=1),
}


@pytest.mark.parametrize("name", list(GRAPH_EXPRS))
def test_graph_trace_constants_hold_values(name):
    """One SGD step (lr 1) in an nn.Graph whose build() runs the expression forward and backward:
    the loss and the updated parameter equal torch's."""
    fn = GRAPH_EXPRS[name]
    w0 = torch.arange(16, dtype=torch.float64).reshape(4, 4) / 7 - 1
    tw = w0.clone().requires_grad_(True)
    t_loss = (fn(torch, tw) * torch.linspace(-1, 1, 4, dtype=torch.float64)).sum()
    t_loss.backward()

    class M(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = flow.nn.Parameter(flow.from_torch(w0.clone()))

    m = M()

    class Step(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=1.0))

        def build(self, c):
            loss = (fn(flow, self.m.w) * c).sum()
            loss.backward()
            return loss

    loss = Step()(flow.from_torch(torch.linspace(-1, 1, 4, dtype=torch.float64)))
    torch.testing.assert_close(loss.to_torch(), t_loss.detach())
    torch.testing.assert_close(m.w.to_torch(), w0 - tw.grad)


# -- the checks catch what CUDA rejects: the cases as they were before a CUDA run failed on them
def _scatter_cpu_index(L, x, s):
    return L.scatter_reduce(x, 0, L.tensor([[0, 1, 0], [2, 0, 1]]), s, "amax", include_self=False)


def _bucketize_cpu_boundaries(L, x):
    return L.bucketize(x, L.tensor([-1.0, 0.0, 0.5]))


def _two(dt, g):
    return (torch.randn(3, 3, generator=g, dtype=dt), torch.randn(2, 3, generator=g, dtype=dt)), {}


_DEVICELESS = [Case("scatter_reduce-cpu-index", lambda x, s: _scatter_cpu_index(flow, x, s),
                    lambda x, s: _scatter_cpu_index(torch, x, s), _two),
               Case("bucketize-cpu-boundaries", lambda x: _bucketize_cpu_boundaries(flow, x),
                    lambda x: _bucketize_cpu_boundaries(torch, x),
                    lambda dt, g: ((torch.randn(3, 4, generator=g, dtype=dt),), {}), grad=False)]


@pytest.mark.parametrize("case", _DEVICELESS, ids=repr)
def test_one_device_catches_a_constant_on_another_device(case):
    """A constant made without ``device=`` in a case: the meta kernels of these ops take a CPU
    tensor beside meta ones (and the CPU kernels a meta one beside CPU ones) without a word;
    :class:`OneDevice` rejects both, as CUDA does."""
    run_case(case, F32, device="meta")  # without the check: passes
    with pytest.raises(RuntimeError, match="same device"), cuda_rules():
        run_case(case, F32, device="meta")
    args, _ = case.make(F32, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="same device"), cuda_rules(), torch.device("meta"):
        case.flow_fn(*to_flow(args, False))  # CPU inputs, the constant on meta


@pytest.mark.parametrize("packed", [False, True])
def test_rnn_train_flag_catches_an_inference_forward_before_backward(packed):
    """torch's RNN kernel with ``train=False`` under inputs that require grad: runs on the CPU,
    rejected by :class:`RnnTrainFlag` as cuDNN's backward rejects it; ``train=True`` passes."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9 if packed else 4, 2, generator=g) if packed else torch.randn(4, 3, 2, generator=g)
    hx = torch.randn(1, 3, 3, generator=g)
    ws = [torch.randn(9, 2, generator=g).requires_grad_(), torch.randn(9, 3, generator=g).requires_grad_()]

    def call(train):
        if packed:
            return torch._VF.gru(x, torch.tensor([3, 3, 2, 1]), hx, ws, False, 1, 0.0, train, False)
        return torch._VF.gru(x, hx, ws, False, 1, 0.0, train, False, False)
    torch.autograd.grad(call(False)[0].sum(), ws)  # the CPU kernel does not mind
    with cuda_rules():
        with pytest.raises(RuntimeError, match="train=False"):
            call(False)
        with torch.no_grad():
            call(False)   # no backward can follow: the inference forward is right
        torch.autograd.grad(call(True)[0].sum(), ws)
