"""``torch.hash_tensor`` (torch 2.13): the xor of the elements' 64-bit patterns, against torch over
dtypes, dims and keepdim through the op-table harness (SBP signatures checked on simulated ranks);
errors of torch's classes; global tensors split along a kept or a reduced axis; nn.Graph."""
import pytest
import torch

import holoflow as flow
from harness import Case, parametrize, randn
from holoflow.distributed import world
from holoflow.sbp import B, S


def both(fn):
    return (lambda *a: fn(flow, *a)), (lambda *a: fn(torch, *a))


def _x(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})


def _ints(dtype):
    return lambda dt, g: ((torch.randint(-50, 50, (4, 5), generator=g).to(dtype),), {})


CASES = [Case("hash_tensor-all", *both(lambda L, x: L.hash_tensor(x)), _x(3, 4), grad=False),
         Case("hash_tensor-dim", *both(lambda L, x: L.hash_tensor(x, 1)), _x(3, 4), grad=False),
         Case("hash_tensor-dims-keepdim", *both(lambda L, x: L.hash_tensor(x, (0, -1), keepdim=True)), _x(2, 3, 4),
              grad=False),
         Case("hash_tensor-method", *both(lambda L, x: x.hash_tensor(dim=0)), _x(5, 2), grad=False),
         Case("hash_tensor-0d", *both(lambda L, x: L.hash_tensor(x.sum())), _x(3), grad=False),
         Case("hash_tensor-bf16", *both(lambda L, x: L.hash_tensor(x.bfloat16(), 0)), _x(4, 3), grad=False)]
CASES += [Case(f"hash_tensor-{str(d).split('.')[-1]}", *both(lambda L, x: L.hash_tensor(x, 1)), _ints(d),
               grad=False, dtypes=(torch.float32,)) for d in (torch.int32, torch.int64, torch.uint8, torch.bool)]
globals().update(parametrize(CASES))


def test_not_differentiable_and_uint64():
    x = flow.randn(3, 4, requires_grad=True)
    h = flow.hash_tensor(x)
    assert h.dtype == flow.uint64 and not h.requires_grad and h.grad_fn is None


@pytest.mark.parametrize("call", [lambda L, x: L.hash_tensor(x, mode=1), lambda L, x: L.hash_tensor(x, 5),
                                  lambda L, x: L.hash_tensor(x.to(L.complex64)),
                                  lambda L, x: L.hash_tensor(L.zeros(0, 3)),
                                  lambda L, x: L.hash_tensor(L.zeros(0, 3), 0)])
def test_errors_of_torchs_classes(call):
    x = torch.randn(3, 4)
    with pytest.raises(Exception) as want:
        call(torch, x)
    with pytest.raises(type(want.value), match="holoflow.hash_tensor"):
        call(flow, flow.from_torch(x))


@pytest.mark.parametrize("sbp,dim,out_sbp", [(S(0), 1, S(0)), (S(1), 1, S(0)), (S(0), None, B), (B, 0, B)])
def test_global_tensor_equals_torch(sbp, dim, out_sbp):
    """A split kept axis stays split; a split reduced axis is resharded first (an xor of shards is
    no SBP value), to the other axis where one is kept."""
    x = torch.randn(4, 6)
    want = torch.hash_tensor(x) if dim is None else torch.hash_tensor(x, dim)

    def run(rank):
        p = flow.placement("cpu", ranks=[0, 1])
        g = flow.from_torch(x.clone()).to_global(p, B).to_global(sbp=sbp)
        h = flow.hash_tensor(g) if dim is None else flow.hash_tensor(g, dim)
        return h.sbp, h.to_global(sbp=B).to_local().to_torch()

    for got_sbp, got in world.simulate(2, run):
        assert got_sbp == (out_sbp,)
        assert torch.equal(got, want)


def test_in_a_graph():
    x = torch.randn(3, 5)

    class G(flow.nn.Graph):
        def build(self, x):
            return flow.hash_tensor(x, 0), x.hash_tensor()

    a, b = G()(flow.from_torch(x))
    assert torch.equal(a.to_torch(), torch.hash_tensor(x, 0)) and torch.equal(b.to_torch(), torch.hash_tensor(x))
