"""Non-sync BatchNorm on global tensors (2 simulated ranks) matches torch on the whole batch:
outputs, input and affine gradients, and the running statistics, for every split of the input
and every SBP of the running-statistics buffers (a channel split used to update boxed copies of
broadcast or partial buffers: stale running statistics, silently)."""
import pytest
import torch

import holoflow as flow
from holoflow.distributed.world import simulate
from holoflow.sbp import B, P, S


def _full(t):
    return t.to_global(sbp=(B,) * t.placement.ndim).to_local().to_torch()


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("buf_sbp", [B, S(0), P], ids=["B", "S0", "P"])
@pytest.mark.parametrize("x_sbp", [S(0), S(1), S(2)], ids=["S0", "S1", "S2"])
def test_batchnorm_training_on_global_input_matches_torch(x_sbp, buf_sbp, momentum):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(6, 4, 5, generator=g) * (i + 1) + i for i in range(3)]
    ref = torch.nn.BatchNorm1d(4, momentum=momentum)
    with torch.no_grad():
        ref.weight.copy_(torch.linspace(0.5, 2.0, 4))
        ref.bias.copy_(torch.linspace(-1.0, 1.0, 4))
    want = []
    for x in xs:
        xt = x.clone().requires_grad_()
        y = ref(xt)
        (y * torch.arange(y.numel()).view(y.shape)).sum().backward()
        want.append((y.detach(), xt.grad.clone()))
    ref.eval()
    want_eval = ref(xs[0]).detach()

    def fn(r):
        place = flow.placement("cpu", [0, 1])
        bn = flow.nn.BatchNorm1d(4, momentum=momentum)
        with flow.no_grad():
            bn.weight.copy_(flow.from_torch(torch.linspace(0.5, 2.0, 4)))
            bn.bias.copy_(flow.from_torch(torch.linspace(-1.0, 1.0, 4)))
        bn.to_global(place, lambda n, t: buf_sbp if n.startswith("running") else B)
        got = []
        for x in xs:
            xg = flow.from_torch(x).to_global(place, sbp=B).to_global(sbp=x_sbp).detach().requires_grad_()
            y = bn(xg)
            w = flow.from_torch(torch.arange(y.numel(), dtype=torch.float32).view(tuple(y.shape)))
            (y * w.to_global(place, sbp=B)).sum().backward()
            got.append((_full(y), _full(xg.grad)))
        stats = (_full(bn.running_mean), _full(bn.running_var), int(_full(bn.num_batches_tracked)))
        grads = (_full(bn.weight.grad), _full(bn.bias.grad))
        bn.eval()
        y_eval = _full(bn(flow.from_torch(xs[0]).to_global(place, sbp=B).to_global(sbp=x_sbp)))
        return got, stats, grads, bn.running_mean.sbp, y_eval

    for got, (rm, rv, nb), (gw, gb), sbp, y_eval in simulate(2, fn):
        assert sbp == (buf_sbp,)  # the buffers keep their SBP
        for (y, gx), (wy, wgx) in zip(got, want):
            torch.testing.assert_close(y, wy, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(gx, wgx, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(rm, ref.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rv, ref.running_var, rtol=1e-5, atol=1e-6)
        assert nb == 3
        torch.testing.assert_close(gw, ref.weight.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(gb, ref.bias.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(y_eval, want_eval, rtol=1e-5, atol=1e-5)
