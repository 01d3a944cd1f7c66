"""torch names scripts touch around the model: cuda/backends/accelerator switches, version,
compile/jit/onnx/hub/testing, legacy typed tensors, dtype/type strings under mock_torch, and
utils.checkpoint (recompute in backward, torch's gradients)."""
import pytest
import torch

import holoflow as flow
from holoflow import mock_torch
from holoflow.core.errors import UnsupportedError
from holoflow.utils.checkpoint import checkpoint, checkpoint_sequential


def _run(src):
    g = {"__name__": "user_script"}
    with mock_torch.enable():
        exec(compile(src, "<script>", "exec"), g)
    return g


def test_device_queries_are_torchs_own():
    assert flow.cuda.is_available() == torch.cuda.is_available()
    assert flow.cuda.device_count() == torch.cuda.device_count()
    assert flow.backends.mps.is_available() == torch.backends.mps.is_available()
    assert flow.accelerator.is_available() == torch.accelerator.is_available()
    flow.cuda.manual_seed_all(3)   # accepted on a CPU-only build, as torch


def test_backend_switches_write_torchs_switches():
    before = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        g = _run("import torch\nimport torch.backends.cudnn as cudnn\ncudnn.deterministic = True\n"
                 "torch.backends.cudnn.benchmark = True\nv = torch.backends.cudnn.benchmark")
        assert g["v"] is True and torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before


def test_version_and_strings_under_mock_torch():
    g = _run("import torch\nv = torch.__version__\nok = torch.__version__ >= '2.0'\n"
             "x = torch.ones(2, dtype=torch.bfloat16)\ns = str(x.dtype)\nt = x.float().type()\n"
             "tl = torch.zeros(1, dtype=torch.long).type()\nxpu = x.is_xpu")
    assert g["v"] == torch.__version__ and g["ok"] is True
    assert (g["s"], g["t"], g["tl"], g["xpu"]) == ("torch.bfloat16", "torch.FloatTensor", "torch.LongTensor", False)
    assert str(flow.bfloat16) == "holoflow.bfloat16" and flow.ones(1).type() == "holoflow.FloatTensor"
    assert flow.ones(2).type("torch.DoubleTensor").dtype is flow.float64


def test_switches_compile_jit_and_assert():
    g = _run("""
import torch
torch.set_float32_matmul_precision("high")
torch.use_deterministic_algorithms(False)
torch.set_num_threads(torch.get_num_threads())
lin = torch.nn.Linear(2, 2)
m = torch.compile(lin)
@torch.compile(mode="reduce-overhead")
def f(x):
    return x * 2
@torch.jit.ignore
def g(x):
    return x
s = torch.jit.script(lin)
torch._assert(True, "fine")
y = torch.ones(1, 3, 4, 4).to(memory_format=torch.channels_last).contiguous(memory_format=torch.channels_last)
""")
    assert g["m"]._orig_mod is g["lin"] and g["s"] is g["lin"] and g["f"](flow.ones(1)).item() == 2.0
    assert torch.get_float32_matmul_precision() == "high"
    torch.set_float32_matmul_precision("highest")
    with pytest.raises(AssertionError, match="boom"):
        flow._assert(False, "boom")


def test_missing_services_raise_clear_errors():
    with pytest.raises(UnsupportedError, match="ONNX export is not implemented"):
        flow.onnx.export(flow.nn.Linear(2, 2), flow.ones(1, 2), "m.onnx")
    with pytest.raises(RuntimeError, match="no network"):
        flow.hub.load("pytorch/vision", "resnet18")
    with pytest.raises(UnsupportedError, match="TorchScript"):
        flow.jit.save(flow.nn.Linear(2, 2), "m.pt")


def test_legacy_typed_tensors():
    a = flow.LongTensor([1, 2, 3])
    assert a.dtype is flow.int64 and a.tolist() == [1, 2, 3]
    b = flow.FloatTensor(2, 3)
    assert b.dtype is flow.float32 and tuple(b.shape) == (2, 3)
    assert isinstance(a, flow.LongTensor) and not isinstance(a, flow.FloatTensor)
    assert tuple(flow.FloatTensor().shape) == (0,)
    with pytest.raises(TypeError, match="FloatTensor"):
        flow.FloatTensor(2, "3")


def test_testing_assert_close():
    flow.testing.assert_close(flow.ones(2), flow.ones(2))
    with pytest.raises(AssertionError):
        flow.testing.assert_close(flow.ones(2), flow.zeros(2))


class _Block(torch.nn.Module):
    pass


def _mlp(nn, p=0.0):
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(p), nn.Linear(8, 4))


# (torch's reentrant form cannot backprop when no input requires grad: that pair is not compared)
@pytest.mark.parametrize("x_requires_grad,use_reentrant", [(True, True), (True, False), (False, False)])
def test_checkpoint_grads_match_torch_and_recompute(x_requires_grad, use_reentrant):
    torch.manual_seed(0)
    tm = _mlp(torch.nn, p=0.3)
    fm = _mlp(flow.nn, p=0.3)
    fm.load_state_dict({k: flow.from_torch(v.clone()) for k, v in tm.state_dict().items()})
    x = torch.randn(3, 4)
    tx, fx = x.clone().requires_grad_(x_requires_grad), flow.from_torch(x.clone()).requires_grad_(x_requires_grad)
    calls = []
    fm[0].register_forward_hook(lambda *a: calls.append(1))
    torch.manual_seed(5)
    tout = torch.utils.checkpoint.checkpoint(tm, tx, use_reentrant=use_reentrant)
    (tout * tout).sum().backward()
    flow.manual_seed(5)
    fout = checkpoint(fm, fx, use_reentrant=use_reentrant)
    (fout * fout).sum().backward()
    torch.testing.assert_close(fout.to_torch(), tout.detach())
    for (n, tp), fp in zip(tm.named_parameters(), fm.parameters()):
        torch.testing.assert_close(fp.grad.to_torch(), tp.grad, msg=n)
    if x_requires_grad:
        torch.testing.assert_close(fx.grad.to_torch(), tx.grad)
    assert len(calls) == 2   # forward once, recomputed once in backward


def test_checkpoint_sequential_and_no_grad():
    torch.manual_seed(0)
    tm = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(4)])
    fm = flow.nn.Sequential(*[flow.nn.Linear(4, 4) for _ in range(4)])
    fm.load_state_dict({k: flow.from_torch(v.clone()) for k, v in tm.state_dict().items()})
    x = torch.randn(2, 4, requires_grad=True)
    fx = flow.from_torch(x.detach().clone()).requires_grad_()
    torch.utils.checkpoint.checkpoint_sequential(tm, 2, x, use_reentrant=False).sum().backward()
    checkpoint_sequential(fm, 2, fx).sum().backward()
    torch.testing.assert_close(fx.grad.to_torch(), x.grad)
    torch.testing.assert_close(fm[0].weight.grad.to_torch(), tm[0].weight.grad)
    with flow.no_grad():
        assert not checkpoint(fm, fx).requires_grad


def test_tensor_helpers_match_torch():
    a, b = torch.randn(3, 1), torch.randn(4)
    fa, fb = flow.from_torch(a.clone()), flow.from_torch(b.clone())
    assert flow.allclose(fa, fa + 1e-9) and not flow.allclose(fa, fa + 1)
    assert torch.equal(flow.isclose(fa, fa * 1.000001).to_torch(), torch.isclose(a, a * 1.000001))
    assert flow.numel(fa) == 3 and flow.is_floating_point(fa) and not flow.is_complex(fa)
    assert flow.result_type(flow.ones(1, dtype=flow.int64), 2.5) is flow.float32
    for (t, f) in zip(torch.broadcast_tensors(a, b), flow.broadcast_tensors(fa, fb)):
        assert torch.equal(f.to_torch(), t)
    x, y = torch.arange(3.0), torch.arange(4.0)
    for ind in ("ij", "xy"):
        for t, f in zip(torch.meshgrid(x, y, indexing=ind), flow.meshgrid(flow.arange(3.0), flow.arange(4.0), indexing=ind)):
            assert torch.equal(f.to_torch(), t)
    fa.requires_grad_()
    sum(g.sum() for g in flow.broadcast_tensors(fa, fb)).backward()
    assert fa.grad.tolist() == [[4.0], [4.0], [4.0]]


def test_constants_size_and_layout_are_torchs():
    g = _run("import torch\nc = (torch.pi, torch.e, torch.inf, torch.nan, torch.newaxis)\n"
             "x = torch.ones(2, 3)\nsame = x.shape == torch.Size([2, 3]) and isinstance(x.shape, torch.Size)\n"
             "lay = x.layout == torch.strided and isinstance(x.layout, torch.layout)\n"
             "m = x.masked_fill(x > 0, -torch.inf)\nu = x[:, torch.newaxis].shape")
    pi, e, inf, nan, newaxis = g["c"]
    assert (pi, e, inf, newaxis) == (torch.pi, torch.e, torch.inf, torch.newaxis) and nan != nan
    assert g["same"] and g["lay"] and tuple(g["u"]) == (2, 1, 3)
    assert bool((g["m"]._data == -torch.inf).all())


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "complex32"])
def test_rare_dtypes_name_their_tensors(name):
    d = getattr(flow, name)
    x = flow.empty(3, dtype=d)
    assert x.dtype is d and x._data.dtype is getattr(torch, name)
    assert str(d) == f"holoflow.{name}" and d.itemsize == getattr(torch, name).itemsize
    # a torch tensor of that dtype (numpy's uint16 here) wraps with a dtype, not a KeyError
    assert flow.from_numpy(torch.zeros(2, dtype=torch.uint16).numpy()).dtype is flow.uint16
    g = _run(f"import torch\ns = str(torch.zeros(1, dtype=torch.{name}).dtype)")
    assert g["s"] == f"torch.{name}"
    assert flow.chalf is flow.complex32


def test_rare_dtype_kernels_fail_as_torchs():
    a = torch.ones(2, dtype=torch.uint32)
    with pytest.raises(NotImplementedError) as theirs:
        a + a
    with pytest.raises(NotImplementedError, match="holoflow.add") as ours:
        flow.ones(2, dtype=flow.uint32) + flow.ones(2, dtype=flow.uint32)
    assert "UInt32" in str(theirs.value) and "UInt32" in str(ours.value)


def test_out_of_memory_keeps_torchs_class():
    """A kernel that runs out of memory raises torch's OutOfMemoryError (holoflow's message), so
    ``except torch.OutOfMemoryError`` catches it under mock_torch."""
    from holoflow.core.dispatch import op_error
    from holoflow.ops.elementwise import ADD
    err = op_error(ADD, (flow.ones(2), flow.ones(2)), {}, torch.OutOfMemoryError("CUDA out of memory. Tried 1 GiB"))
    assert type(err) is torch.OutOfMemoryError and "holoflow.add" in str(err) and "out of memory" in str(err)
    g = _run("import torch\nok = torch.OutOfMemoryError is __import__('holoflow').OutOfMemoryError")
    assert g["ok"] and flow.AcceleratorError is torch.AcceleratorError
