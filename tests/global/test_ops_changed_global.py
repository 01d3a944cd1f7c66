"""The functions this project reworked to match torch (take_along_dim's broadcasting, scatter's
reduce form, logaddexp as an op, dot/mv/outer, cosine_similarity's clamped norms, normalize with
p=inf, xlogy's dtype, the nuclear norm, pinv's hermitian form) on global tensors of each 1-D SBP
on 2 simulated ranks: values and input gradients equal to the single-process results."""
from __future__ import annotations

import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, S

G = torch.Generator().manual_seed(0)
X, Y, V = (torch.randn(4, 6, generator=G, dtype=torch.float64), torch.randn(4, 6, generator=G, dtype=torch.float64),
           torch.randn(6, generator=G, dtype=torch.float64))
IDX, SIDX = torch.tensor([[1], [0], [5], [2]]), torch.tensor([[0, 1, 0, 2, 1, 0]] * 2)

# (lib, x, y, v, idx, sidx) -> tensor
FUNCTIONS = {
    "take_along_dim": lambda m, x, y, v, i, s: m.take_along_dim(x, i, 1),
    # (torch's reduce form has no derivative: holoflow's is scatter_reduce "sum", torch's reference too)
    "scatter reduce add": lambda m, x, y, v, i, s: x.scatter(0, s, y[:2], reduce="add") if m is not torch
    else x.scatter_reduce(0, s, y[:2], "sum"),
    "logaddexp": lambda m, x, y, v, i, s: m.logaddexp(x, y),
    "mv": lambda m, x, y, v, i, s: m.mv(x, v),
    "dot": lambda m, x, y, v, i, s: m.dot(x[1], v),
    "outer": lambda m, x, y, v, i, s: m.outer(x[2], v),
    "cosine_similarity": lambda m, x, y, v, i, s: m.nn.functional.cosine_similarity(x, y, dim=1, eps=2.5),
    "normalize inf": lambda m, x, y, v, i, s: m.nn.functional.normalize(x, p=float("inf"), dim=0),
    "xlogy": lambda m, x, y, v, i, s: m.xlogy(x.abs(), y.abs()),
    "norm nuc": lambda m, x, y, v, i, s: m.norm(x, p="nuc"),
    "pinv hermitian": lambda m, x, y, v, i, s: m.linalg.pinv(x @ x.T, hermitian=True),
}


@pytest.mark.parametrize("sbp", [B, S(0), S(1)], ids=["B", "S0", "S1"])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_reworked_functions_on_global_tensors_match_one_process(name, sbp):
    fn = FUNCTIONS[name]
    x = X.clone().requires_grad_()
    want = fn(torch, x, Y, V, IDX, SIDX)
    want.sum().backward()

    def run(rank):
        place = flow.placement("cpu", [0, 1])

        def glob(t, grad=False):
            g = flow.from_torch(t).to_global(placement=place, sbp=[B])
            g = g.to_global(sbp=[sbp] if t.dim() > 1 or sbp != S(1) else [B])
            return g.detach().requires_grad_() if grad else g
        gx = glob(X, grad=True)
        out = fn(flow, gx, glob(Y), glob(V), glob(IDX), glob(SIDX))
        out.sum().backward()
        return (out.to_global(sbp=[B]).to_local().detach().to_torch(),
                gx.grad.to_global(sbp=[B]).to_local().to_torch())
    for got, grad in world.simulate(2, run):
        torch.testing.assert_close(got, want.detach())
        torch.testing.assert_close(grad, x.grad)


@pytest.mark.parametrize("cast", ["bfloat16", "double", "T.bfloat16", "float", "to-cpu"])
@pytest.mark.parametrize("sbp", [B, S(0), S(1)], ids=["B", "S0", "S1"])
def test_in_place_write_into_a_cast_of_a_global_tensor(cast, sbp):
    """``x.bfloat16().div_(2)`` on a split global tensor was refused ("the view chain ['to'] does
    not view a tensor ... its write would be lost"): the cast is a copy (as torch's), written in
    place alone; a cast to the same dtype or device is x itself, and the write reaches x."""
    def apply_cast(t):
        if cast == "T.bfloat16":
            return t.T.bfloat16()
        if cast == "to-cpu":
            return t.to("cpu")
        return getattr(t, cast)()
    x = X.clone().float()
    want_y = apply_cast(x)
    want_y.div_(2)

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        g = flow.from_torch(X.clone().float()).to_global(placement=place, sbp=[B]).to_global(sbp=[sbp])
        y = apply_cast(g)
        y.div_(2)
        return (g.to_global(sbp=[B]).to_local().to_torch(), y.to_global(sbp=[B]).to_local().to_torch())
    for got_x, got_y in world.simulate(2, run):
        torch.testing.assert_close(got_x, x)
        torch.testing.assert_close(got_y, want_y)
