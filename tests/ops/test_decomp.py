"""ops/decomp.py vs torch: linalg.svd/svdvals/qr/eigh/eigvalsh, torch.svd/qr, cdist; forward +
backward (ATen's derivatives through the vjp backward op), gradcheck, SBP on simulated ranks."""
import pytest
import torch

import holoflow as flow
import holoflow.nn.functional as HF
from harness import F32, F64, Case, parametrize, randn


def _m(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})


def _sym(a):
    """eigh reads one triangle and its gradient is torch's symmetric one, so the case function
    symmetrizes its input (finite differences then agree with it)."""
    return (a + a.transpose(-2, -1)) * 0.5


CASES = []
for shape in [(4, 3), (3, 5), (2, 4, 4), (2, 3, 5, 3)]:
    CASES.append(Case(f"linalg.svd-reduced{list(shape)}", lambda a: flow.linalg.svd(a, full_matrices=False),
                      lambda a: torch.linalg.svd(a, full_matrices=False), _m(*shape)))
    CASES.append(Case(f"svdvals{list(shape)}", lambda a: flow.linalg.svdvals(a), lambda a: torch.linalg.svdvals(a),
                      _m(*shape)))
    CASES.append(Case(f"torch.svd{list(shape)}", lambda a: tuple(flow.svd(a)), lambda a: tuple(torch.svd(a)),
                      _m(*shape)))
    CASES.append(Case(f"linalg.qr{list(shape)}", lambda a: flow.linalg.qr(a), lambda a: torch.linalg.qr(a), _m(*shape)))
    CASES.append(Case(f"qr-r{list(shape)}", lambda a: flow.linalg.qr(a, mode="r")[1],
                      lambda a: torch.linalg.qr(a, mode="r")[1], _m(*shape), grad=False))
for shape in [(4, 4), (3, 3, 3)]:
    CASES.append(Case(f"linalg.svd-full{list(shape)}", lambda a: flow.linalg.svd(a),
                      lambda a: torch.linalg.svd(a), _m(*shape)))
    CASES.append(Case(f"qr-complete{list(shape)}", lambda a: tuple(flow.qr(a, some=False)),
                      lambda a: tuple(torch.qr(a, some=False)), _m(*shape)))
    for uplo in ("L", "U"):
        CASES.append(Case(f"eigh-{uplo}{list(shape)}", lambda a, u=uplo: flow.linalg.eigh(_sym(a), UPLO=u),
                          lambda a, u=uplo: torch.linalg.eigh(_sym(a), UPLO=u), _m(*shape)))
        CASES.append(Case(f"eigvalsh-{uplo}{list(shape)}", lambda a, u=uplo: flow.linalg.eigvalsh(_sym(a), UPLO=u),
                          lambda a, u=uplo: torch.linalg.eigvalsh(_sym(a), UPLO=u), _m(*shape)))
    CASES.append(Case(f"eigh-raw-triangle{list(shape)}", lambda a: flow.linalg.eigh(a, UPLO="U"),
                      lambda a: torch.linalg.eigh(a, UPLO="U"), _m(*shape), gradcheck=False))
CASES.append(Case("torch.svd-no-uv", lambda a: tuple(flow.svd(a, compute_uv=False)),
                  lambda a: tuple(torch.svd(a, compute_uv=False)), _m(4, 3),
                  gradcheck=False))  # the harness's finite differences pair outputs by position


def _pair(s1, s2, dup=False):
    def make(dt, g):
        a, b = randn(*s1, gen=g, dtype=dt), randn(*s2, gen=g, dtype=dt)
        if dup:  # a zero distance: torch's gradient there is 0, not nan
            b[..., 0, :] = a[..., 0, :]
        return (a, b), {}
    return make


for s1, s2 in [((4, 3), (5, 3)), ((2, 3, 4), (2, 6, 4)), ((0, 3), (2, 3)), ((30, 3), (27, 3)),
               ((2, 1, 3, 4), (3, 5, 4)), ((3, 4), (2, 5, 4))]:   # the last two broadcast batch dims
    for p in (2.0, 1.0, 3.0, float("inf")):
        CASES.append(Case(f"cdist-p{p}{list(s1)}{list(s2)}", lambda a, b, p=p: HF.cdist(a, b, p),
                          lambda a, b, p=p: torch.cdist(a, b, p), _pair(s1, s2), gradcheck=p != float("inf")))
CASES.append(Case("cdist-zero-distance", lambda a, b: flow.cdist(a, b), lambda a, b: torch.cdist(a, b),
                  _pair((3, 4), (2, 4), dup=True), gradcheck=False))
CASES.append(Case("cdist-no-mm", lambda a, b: flow.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"),
                  lambda a, b: torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist"), _pair((5, 3), (4, 3))))
globals().update(parametrize(CASES))


def test_bad_inputs_name_the_op_and_shapes():
    with pytest.raises(ValueError, match="linalg.svd.*matrices"):
        flow.linalg.svd(flow.randn(3))
    with pytest.raises(ValueError, match="eigh.*square"):
        flow.linalg.eigh(flow.randn(3, 4))
    with pytest.raises(ValueError, match="cdist.*\\(4, 3\\).*\\(5, 2\\)"):
        flow.cdist(flow.randn(4, 3), flow.randn(5, 2))
    with pytest.raises(ValueError, match="qr: mode"):
        flow.linalg.qr(flow.randn(3, 3), mode="full")


def test_decompositions_trace_in_graph_mode():
    class M(flow.nn.Module):
        def forward(self, a):
            u, s, vh = flow.linalg.svd(a, full_matrices=False)
            q, r = flow.linalg.qr(a)
            w, v = flow.linalg.eigh(a.transpose(0, 1) @ a)
            return u.abs().sum() + s.sum() + q.abs().sum() + w.sum() + flow.cdist(a, a).sum()

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = M()

        def build(self, a):
            return self.m(a)

    a = torch.randn(5, 3, dtype=torch.float64)
    got = G()(flow.from_torch(a.clone()))
    want = torch.linalg.svd(a, full_matrices=False)[0].abs().sum() + torch.linalg.svdvals(a).sum() \
        + torch.linalg.qr(a)[0].abs().sum() + torch.linalg.eigvalsh(a.T @ a).sum() + torch.cdist(a, a).sum()
    torch.testing.assert_close(got.to_torch(), want)


_ = F32, F64


def test_tensor_methods_svd_and_qr_match_torch():
    a = torch.randn(5, 3, dtype=torch.float64)
    fa = flow.from_torch(a.clone())
    for got, want in zip(fa.svd(), a.svd()):
        torch.testing.assert_close(got.to_torch(), want)
    for got, want in zip(fa.qr(some=False), a.qr(some=False)):
        torch.testing.assert_close(got.to_torch(), want)
