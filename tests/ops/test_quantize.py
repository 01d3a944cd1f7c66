"""Fake quantization (torch.fake_quantize_per_tensor_affine / _per_channel_affine) vs torch:
values, the straight-through gradient, SBP rules; torch's errors."""
import pytest
import torch

import holoflow as flow
from harness import BF16, F32, F64, Case, parametrize, randn

F16 = torch.float16


def _x(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt) * 3,), {})


def _channel(shape, axis):   # (scale and zero point built in the call: torch refuses them requiring grad)
    def make(dt, g):
        n = shape[axis]
        scale = torch.rand(n, generator=g, dtype=F64).add(0.1).to(torch.float32)
        zero = torch.randint(-3, 4, (n,), generator=g, dtype=torch.int32)
        return (randn(*shape, gen=g, dtype=dt) * 3,), {"qparams": (scale.tolist(), zero.tolist())}
    return make


def _per_channel(lib, x, qparams, axis, qmin, qmax):
    scale = lib.tensor(qparams[0], device=x.device)
    zero = lib.tensor(qparams[1], dtype=lib.int32, device=x.device)
    return lib.fake_quantize_per_channel_affine(x, scale, zero, axis, qmin, qmax)


def _qparams(lib, scale, zero, like):
    return lib.tensor(scale, device=like.device), lib.tensor(zero, device=like.device)


# (the straight-through gradient is not the derivative finite differences see: no gradcheck)
CASES = []
for qmin, qmax in [(0, 255), (-128, 127), (-8, 7)]:
    for scale, zero in [(0.1, 0), (0.37, 5)]:
        CASES.append(Case(f"fake_quantize_per_tensor-{scale}-{zero}-[{qmin},{qmax}]",
                          lambda x, s=scale, z=zero, a=qmin, b=qmax: flow.fake_quantize_per_tensor_affine(x, s, z, a, b),
                          lambda x, s=scale, z=zero, a=qmin, b=qmax: torch.fake_quantize_per_tensor_affine(x, s, z, a, b),
                          _x(4, 5, 3), dtypes=(F32, F64, BF16, F16), gradcheck=False))
        CASES.append(Case(f"fake_quantize_per_tensor-tensor_qparams-{scale}-{zero}-[{qmin},{qmax}]",
                          lambda x, s=scale, z=zero, a=qmin, b=qmax: flow.fake_quantize_per_tensor_affine(
                              x, *_qparams(flow, s, z, x), a, b),
                          lambda x, s=scale, z=zero, a=qmin, b=qmax: torch.fake_quantize_per_tensor_affine(
                              x, *_qparams(torch, s, z, x), a, b),
                          _x(6, 4), gradcheck=False))
for shape, axis in [((4, 5, 3), 0), ((4, 5, 3), 1), ((4, 5, 3), 2), ((6,), 0)]:
    CASES.append(Case(f"fake_quantize_per_channel-{list(shape)}-axis{axis}",
                      lambda x, qparams, a=axis: _per_channel(flow, x, qparams, a, -8, 7),
                      lambda x, qparams, a=axis: _per_channel(torch, x, qparams, a, -8, 7),
                      _channel(shape, axis), dtypes=(F32, F64, BF16), gradcheck=False))

# (no case has a gradcheck, so parametrize makes none: the gradient is checked against torch's instead)
globals().update(parametrize(CASES))


def test_values_at_the_grid_edges_and_the_clamp():
    x = torch.tensor([-1.0, -0.05, 0.05, 0.15, 0.25, 0.35, 2.54, 2.56, 9.0], requires_grad=True)
    fx = flow.from_torch(x.detach()).requires_grad_()
    want = torch.fake_quantize_per_tensor_affine(x, 0.1, 3, 0, 27)
    got = flow.fake_quantize_per_tensor_affine(fx, 0.1, 3, 0, 27)
    assert got.to_torch().tolist() == want.tolist()   # bit for bit: torch's kernel, torch's rounding
    want.sum().backward()
    got.sum().backward()
    assert fx.grad.to_torch().tolist() == x.grad.tolist() == [0.0, 1, 1, 1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize("call,err", [
    (lambda m, x, s: m.fake_quantize_per_tensor_affine(x, 0.1, 0, 10, 5), RuntimeError),
    (lambda m, x, s: m.fake_quantize_per_channel_affine(x, s(torch.ones(5)), s(torch.zeros(5, dtype=torch.int32)),
                                                         1, 0, 255), RuntimeError),
    (lambda m, x, s: m.fake_quantize_per_channel_affine(x, s(torch.ones(6)), s(torch.zeros(6, dtype=torch.int32)),
                                                         2, 0, 255), IndexError),
    (lambda m, x, s: m.fake_quantize_per_tensor_affine(x.long(), 0.1, 0, 0, 5), NotImplementedError),
    (lambda m, x, s: m.fake_quantize_per_channel_affine(x, s(torch.ones(6)), s(torch.zeros(6, dtype=torch.int32)),
                                                         -1, 0, 255), RuntimeError),
], ids=["qmin>qmax", "scale-size", "axis", "integer-input", "negative-axis"])
def test_bad_arguments_raise_torchs_error_classes(call, err):
    x = torch.randn(4, 6)
    with pytest.raises(err):
        call(torch, x, lambda t: t)
    with pytest.raises(err, match="fake_quantize"):
        call(flow, flow.from_torch(x), flow.from_torch)


def test_from_torch_refuses_a_holoflow_tensor():
    with pytest.raises(TypeError, match="holoflow.from_torch: expected a torch.Tensor, got holoflow.*Tensor "
                                        r"\(it is a holoflow tensor already\)"):
        flow.from_torch(flow.ones(2))


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_scale_requiring_grad_is_refused_as_torch_refuses_it(per_channel):
    def call(lib):
        x, scale = lib.randn(4, requires_grad=True), lib.ones(4 if per_channel else (), requires_grad=True)
        zero = lib.zeros(4 if per_channel else (), dtype=lib.int32)
        if per_channel:
            return lib.fake_quantize_per_channel_affine(x, scale, zero, 0, 0, 255)
        return lib.fake_quantize_per_tensor_affine(x, scale, zero, 0, 255)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'scale'"):
        call(torch)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'scale'"):
        call(flow)
    with flow.no_grad():   # (no graph: nothing to refuse)
        assert call(flow).shape == (4,)


@pytest.mark.parametrize("overload", ["numbers", "tensor_qparams", "per_channel"])
def test_dtype_under_cpu_autocast_is_torchs(overload):
    """torch's CPU autocast lists the number-scale overload as float32 (a bfloat16 input comes out
    float32); the tensor-qparams and per-channel forms stay in the input's dtype."""
    def call(lib):
        x = lib.ones(4, 3, dtype=lib.bfloat16)
        if overload == "numbers":
            return lib.fake_quantize_per_tensor_affine(x, 0.1, 0, 0, 255)
        if overload == "tensor_qparams":
            return lib.fake_quantize_per_tensor_affine(x, lib.tensor(0.1), lib.tensor(0), 0, 255)
        return lib.fake_quantize_per_channel_affine(x, lib.ones(3), lib.zeros(3, dtype=lib.int32), 1, 0, 255)
    with torch.autocast("cpu", torch.bfloat16):
        want = call(torch)
    with flow.autocast("cpu", flow.bfloat16):
        got = call(flow)
    assert got.to_torch().dtype == want.dtype
    torch.testing.assert_close(got.to_torch(), want)
