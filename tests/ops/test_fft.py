"""torch.fft's transforms vs torch: values and gradients through complex intermediates (each case
ends real, so the harness's gradcheck and SBP checks apply), norms, n/s trimming and padding."""
import pytest
import torch

import holoflow as flow
from harness import F32, F64, Case, parametrize, randn


def ins(*shapes):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt) for s in shapes), {})


def _real(m, z):
    return flow.ops.fft.real_part(z) if m is flow else z.real.clone()


def both(build):
    """A case body written once for torch and holoflow: ``build(m, fft, x)``."""
    return (lambda *a: build(flow, flow.fft, *a)), (lambda *a: build(torch, torch.fft, *a))


BODIES = {
    "rfft-irfft": lambda m, F, x: F.irfft(F.rfft(x) * 0.5, n=x.shape[-1]),
    "rfft-norms-n": lambda m, F, x: F.irfft(F.rfft(x, n=6, norm="ortho"), n=7, norm="forward"),
    "rfft-trim-irfft-default-n": lambda m, F, x: F.irfft(F.rfft(x, n=5, dim=0), dim=0),
    "fft-real-input": lambda m, F, x: _real(m, F.fft(x, dim=1)),
    "fft-ifft-c2c": lambda m, F, x: F.irfft(F.ifft(F.fft(F.rfft(x), norm="ortho"), n=4, norm="ortho"), n=6),
    "fft-pad": lambda m, F, x: _real(m, F.ifft(F.fft(x, n=9) * 1.5)),  # (complex*complex grads: see mul)
    "fftn-ifftn": lambda m, F, x: _real(m, F.ifftn(F.fftn(x, dim=(0, 1)) * 2, dim=(0, 1))),
    "rfft2-irfft2": lambda m, F, x: F.irfft2(F.rfft2(x), s=x.shape[-2:]),
    "rfftn-s": lambda m, F, x: F.irfftn(F.rfftn(x, s=(3, 4)), s=(4, 6)),
    "fftshift": lambda m, F, x: F.ifftshift(F.fftshift(x, dim=1) * 3, dim=1),
    # the Hermitian transforms (once missing)
    "ihfft-hfft": lambda m, F, x: F.hfft(F.ihfft(x) * 2, n=x.shape[-1]),
    "hfft-norms-n": lambda m, F, x: F.hfft(F.rfft(x, norm="forward"), n=5, norm="ortho"),
    "ihfft2-hfft2": lambda m, F, x: F.hfft2(F.ihfft2(x, norm="ortho"), s=x.shape[-2:]),
    "fftn-hfftn": lambda m, F, x: F.hfftn(F.fftn(x, dim=(0, 1)), dim=(0, 1), norm="forward"),
    "ihfftn-s": lambda m, F, x: F.irfftn(F.ihfftn(x, s=(3, 4)), s=(4, 6)),
}
CASES = [Case(name, *both(body), ins((4, 6)), dtypes=(F32, F64)) for name, body in BODIES.items()]
CASES += [Case("fft-3d-dim0", *both(lambda m, F, x: _real(m, F.fft(x, dim=0))), ins((3, 2, 5)), dtypes=(F64,))]

globals().update(parametrize(CASES))


def test_complex_outputs_match_torch():
    x = torch.randn(3, 8, dtype=torch.float64)
    fx = flow.from_torch(x.clone())
    for fn in ("rfft", "fft", "ifft"):
        torch.testing.assert_close(getattr(flow.fft, fn)(fx).to_torch(), getattr(torch.fft, fn)(x))
    torch.testing.assert_close(flow.fft.fft2(fx).to_torch(), torch.fft.fft2(x))
    for fn in ("ihfft", "ihfft2", "ihfftn"):
        torch.testing.assert_close(getattr(flow.fft, fn)(fx).to_torch(), getattr(torch.fft, fn)(x))
    z = torch.fft.rfft(x)
    torch.testing.assert_close(flow.fft.hfft(flow.from_torch(z)).to_torch(), torch.fft.hfft(z))
    torch.testing.assert_close(flow.fft.rfftfreq(8).to_torch(), torch.fft.rfftfreq(8))
    torch.testing.assert_close(flow.fft.fftfreq(5, 0.5).to_torch(), torch.fft.fftfreq(5, 0.5))


def test_bad_arguments():
    with pytest.raises(ValueError, match="normalization"):
        flow.fft.fft(flow.ones(4), norm="unitary")
    with pytest.raises(ValueError, match="normalization"):
        flow.fft.hfft(flow.ones(4), norm="unitary")
    with pytest.raises(RuntimeError, match="real input"):
        flow.fft.rfft(flow.fft.fft(flow.ones(4)))
    with pytest.raises(IndexError, match="fft"):
        flow.fft.fft(flow.ones(4), dim=2)
