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
"""
from __future__ import annotations

import importlib
import pkgutil

import ops as ops_tests
import perf_paths
import pytest
import torch
from harness import leaves, run_case, to_flow

import holoflow as flow

# Pass 1: cases whose kernels (holoflow's or torch's reference) need values meta tensors lack.
_NONZERO = "data-dependent output shape (the number of true mask elements / nonzeros): no meta kernel"
_ITEM = "reads a value with .item(): {}"
NEEDS_DATA = {
    "masked_select": _NONZERO,
    "masked_select-broadcast": _NONZERO,
    "masked_select_backward": _NONZERO,
    "index_backward-mask": _NONZERO,
    "nonzero": _NONZERO,
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
NEEDS_DATA["bincount"] = NEEDS_DATA["bincount-weights-minlength"] = \
    "data-dependent output shape (the largest value + 1): no meta kernel"
_CTC = "aten::_ctc_loss has no meta kernel"
for _tag in ("{'reduction': 'mean'}-padded", "{'reduction': 'mean', 'blank': 0}-flat", "{'reduction': 'sum'}-padded",
             "{'reduction': 'sum', 'blank': 0}-flat", "{'reduction': 'none'}-padded",
             "{'reduction': 'none', 'blank': 0}-flat", "{'reduction': 'mean'}-lists",
             "{'reduction': 'none', 'zero_infinity': True}-zero-inf", "{'reduction': 'sum', 'blank': 4}-blank4"):
    NEEDS_DATA[f"ctc_loss{_tag}"] = _CTC


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
        or isinstance(e, ZeroDivisionError)


@pytest.mark.parametrize("case", [c for c in CASES if c.name not in NEEDS_DATA], ids=repr)
def test_on_meta_device(case):
    run_case(case, case.dtypes[0], device="meta")


@pytest.mark.parametrize("case", [c for c in CASES if c.name in NEEDS_DATA], ids=repr)
def test_needs_data_is_why_meta_fails(case):
    """The listed cases fail on meta for the listed reason, not for a device mismatch (a case that
    starts passing should leave the list)."""
    with pytest.raises(Exception) as info:
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
    with torch.device("meta"):
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
