"""``F.grouped_mm`` (torch 2.13's grouped GEMM of Mixture-of-Experts layers) against torch in its
four layouts: values and gradients of both operands through the op-table harness (float32 and
bfloat16; torch's kernel has no float64, so no finite differences: second derivatives are compared
with torch's instead), SBP signatures on simulated ranks, errors of torch's class, expert-parallel
global tensors (the group dimension split) on 2 simulated ranks, and nn.Graph."""
import pytest
import torch

import holoflow as flow
from harness import BF16, F32, Case, parametrize, randn
from holoflow.distributed import world
from holoflow.sbp import B, P, S


def _offs(*ends):
    return torch.tensor(ends, dtype=torch.int32)


# name -> (shape of a, shape of b, offs): the four layouts (every stride of the operands and of
# their transposes in backward a multiple of 16 bytes: dims of 8 in bfloat16)
LAYOUTS = {"2d3d": ((16, 8), (3, 8, 16), _offs(3, 7, 16)),
           "2d3d-empty-group": ((16, 8), (3, 8, 8), _offs(5, 5, 16)),
           "3d3d": ((3, 8, 8), (3, 8, 16), None),
           "3d2d": ((3, 8, 8), (8, 24), _offs(8, 16, 24)),
           "2d2d": ((8, 24), (24, 16), _offs(8, 16, 24))}


def _make(shape_a, shape_b, offs):
    def make(dt, g):
        return (randn(*shape_a, gen=g, dtype=dt), randn(*shape_b, gen=g, dtype=dt)), \
            ({} if offs is None else {"offs": offs.clone()})
    return make


def both(L, a, b, offs=None):
    return L.nn.functional.grouped_mm(a, b, offs=offs)


CASES = [Case(f"grouped_mm-{name}", lambda a, b, **k: both(flow, a, b, **k), lambda a, b, **k: both(torch, a, b, **k),
              _make(*spec), dtypes=(BF16, F32), gradcheck=False) for name, spec in LAYOUTS.items()]
CASES.append(Case("grouped_mm-transposed-b", lambda a, b, offs: both(flow, a, b.transpose(-2, -1), offs),
                  lambda a, b, offs: both(torch, a, b.transpose(-2, -1), offs),
                  _make((16, 8), (3, 16, 8), _offs(3, 7, 16)), dtypes=(BF16, F32), gradcheck=False))
globals().update(parametrize(CASES))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_second_derivatives_equal_torchs(name):
    shape_a, shape_b, offs = LAYOUTS[name]
    g = torch.Generator().manual_seed(1)
    a0, b0 = randn(*shape_a, gen=g), randn(*shape_b, gen=g)
    out = []
    for L, conv in ((torch, lambda t: t), (flow, flow.from_torch)):
        a, b = conv(a0.clone()).requires_grad_(), conv(b0.clone()).requires_grad_()
        y = L.nn.functional.grouped_mm(a, b, offs=None if offs is None else conv(offs.clone()))
        w = conv(torch.linspace(-1, 1, y.numel()).reshape(y.shape))
        ga, gb = L.autograd.grad((y * w).sum(), (a, b), create_graph=True)
        out.append([t.detach() if L is torch else t.detach().to_torch()
                    for t in L.autograd.grad((ga * ga).sum() + (gb * gb.sin()).sum(), (a, b))])
    for got, want in zip(out[1], out[0]):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("call", [
    lambda L, T: L.nn.functional.grouped_mm(T(torch.randn(12, 8)), T(torch.randn(3, 8, 12))),        # no offs
    lambda L, T: L.nn.functional.grouped_mm(T(torch.randn(3, 4, 8)), T(torch.randn(3, 8, 12)), offs=T(_offs(1, 2, 3))),
    lambda L, T: L.nn.functional.grouped_mm(T(torch.randn(12, 8)), T(torch.randn(3, 4, 12)), offs=T(_offs(3, 7, 12))),
    lambda L, T: L.nn.functional.grouped_mm(T(torch.randn(12, 8)), T(torch.randn(3, 8, 12)),
                                            offs=T(_offs(3, 7, 12).long())),
    lambda L, T: L.nn.functional.grouped_mm(T(torch.randn(12, 8).double()), T(torch.randn(3, 8, 12).double()),
                                            offs=T(_offs(3, 7, 12))),
    lambda L, T: L.nn.functional.grouped_mm(T(torch.randn(12, 8)), T(torch.randn(3, 8, 12)), offs=T(_offs(3, 7, 12)),
                                            bias=T(torch.randn(3, 12))),
    lambda L, T: L.nn.functional.grouped_mm(T(torch.randn(12, 3)), T(torch.randn(3, 3, 5)), offs=T(_offs(3, 7, 12))),
], ids=["no-offs", "offs-with-3d", "contraction", "int64-offs", "float64", "bias", "unaligned"])
def test_errors_are_torchs_class(call):
    with pytest.raises(RuntimeError):
        call(torch, lambda t: t)
    with pytest.raises(RuntimeError, match="grouped_mm"):
        call(flow, flow.from_torch)


@pytest.mark.parametrize("sbp_a,sbp_b,out_sbp", [(S(0), S(0), S(0)), (B, S(2), S(2)), (S(2), S(1), P)],
                         ids=["experts", "columns", "contraction"])
def test_expert_parallel_global_tensors_equal_torch(sbp_a, sbp_b, out_sbp):
    """3-D operands on 2 simulated ranks: the group (expert) dimension split gives each rank its
    experts' products with no communication; forward and both gradients equal torch's."""
    g = torch.Generator().manual_seed(2)
    a0, b0, up = randn(4, 4, 8, gen=g), randn(4, 8, 16, gen=g), randn(4, 4, 16, gen=g)
    ta, tb = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    ty = torch.nn.functional.grouped_mm(ta, tb)
    tga, tgb = torch.autograd.grad(ty, (ta, tb), up)

    def run(rank):
        place = flow.placement("cpu", ranks=[0, 1])
        glob = lambda t, s: flow.from_torch(t.clone()).to_global(place, B).to_global(sbp=s)
        a, b = glob(a0, sbp_a).requires_grad_(), glob(b0, sbp_b).requires_grad_()
        with flow.comm.count() as counted:
            y = flow.nn.functional.grouped_mm(a, b)
        ga, gb = flow.autograd.grad(y, (a, b), glob(up, y.sbp[0]) if y.sbp[0] != P else glob(up, B))
        whole = lambda t: t.to_global(sbp=B).to_local().to_torch()
        return y.sbp, counted.total, whole(y), whole(ga), whole(gb)

    for sbp, calls, y, ga, gb in world.simulate(2, run):
        assert sbp == (out_sbp,) and calls == 0
        torch.testing.assert_close(y, ty.detach())
        torch.testing.assert_close(ga, tga)
        torch.testing.assert_close(gb, tgb)


def test_in_a_training_graph_as_eager():
    """A Mixture-of-Experts step (tokens sorted by expert, offs from the router's counts) in
    nn.Graph: loss and both experts' weights after two SGD steps equal torch's."""
    g = torch.Generator().manual_seed(3)
    x0, w0 = randn(12, 8, gen=g), randn(3, 8, 16, gen=g) * 0.3
    offs = _offs(4, 9, 12)

    def step(L, x, w, opt):
        loss = L.nn.functional.grouped_mm(x, w, offs=offs if L is torch else flow.from_torch(offs)).tanh().sum()
        return loss

    tw = torch.nn.Parameter(w0.clone())
    topt = torch.optim.SGD([tw], lr=0.1)
    want = []
    for _ in range(2):
        topt.zero_grad()
        loss = step(torch, x0, tw, topt)
        loss.backward()
        topt.step()
        want.append(loss.item())

    fw = flow.nn.Parameter(flow.from_torch(w0.clone()))
    fopt = flow.optim.SGD([fw], lr=0.1)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(fopt)

        def build(self, x):
            loss = step(flow, x, fw, fopt)
            loss.backward()
            return loss

    graph = G()
    got = [float(graph(flow.from_torch(x0.clone()))) for _ in range(2)]
    assert got == pytest.approx(want, rel=1e-5)
    torch.testing.assert_close(fw.detach().to_torch(), tw.detach())
