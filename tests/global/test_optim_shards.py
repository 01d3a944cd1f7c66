"""Eager optimizer steps of global parameters whose gradients and state are laid out as they are
(fully_shard's shards) run the foreach lowering on each rank's pieces (simulated ranks): bit for
bit the per-tensor holoflow ops (``foreach=False``), with state made by the rule laid out as its
parameter, and no global op dispatched."""
import inspect

import numpy as np
import pytest

import holoflow as flow
from holoflow.core.errors import UnsupportedError
from holoflow.distributed import world
from holoflow.distributed.device_mesh import DeviceMesh
from holoflow.dtensor.fsdp import fully_shard
from holoflow.optim.optimizer import Optimizer


def _classes() -> list:
    return sorted(n for n in dir(flow.optim) if inspect.isclass(getattr(flow.optim, n))
                  and issubclass(getattr(flow.optim, n), Optimizer)
                  and n not in ("Optimizer", "SparseAdam", "LBFGS"))   # (sparse gradients; a closure)


def _elementwise() -> list:
    """The optimizers whose rule runs elementwise (the others read whole tensors: norms, matrix
    products, factored statistics; their eager steps of global parameters see them whole)."""
    return [n for n in _classes() if getattr(flow.optim, n)._step_foreach is Optimizer._step_foreach]


_OPTIONS = {"SGD": {"momentum": 0.9, "weight_decay": 0.1}, "Adam": {"amsgrad": True, "weight_decay": 0.1},
            "AdamW": {"weight_decay": 0.1}, "RMSprop": {"momentum": 0.5, "centered": True}}


def _train(name: str, foreach, r: int, forbid_ops: bool) -> tuple:
    cls = getattr(flow.optim, name)
    rng = np.random.default_rng(3)
    m = flow.nn.Sequential(flow.nn.Linear(6, 5), flow.nn.Tanh(), flow.nn.Linear(5, 3))
    m.load_state_dict({k: flow.tensor(rng.standard_normal(tuple(v.shape)).astype(np.float32))
                       for k, v in m.state_dict().items()})
    fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
    kw = dict(_OPTIONS.get(name, {}), lr=0.01)
    if "foreach" in inspect.signature(cls).parameters:
        kw["foreach"] = foreach
    opt = cls(m.parameters(), **kw)
    if forbid_ops:
        def refuse(*a, **k):
            raise AssertionError(f"{name}: an eager step of shards took the per-tensor ops")
        opt._step_ops = refuse
    x = flow.tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6) * (1 + r))
    for _ in range(3):
        opt.zero_grad()
        (m(x) ** 2).mean().backward()
        opt.step()
    params = {k: p.to_local().detach().numpy() for k, p in m.named_parameters()}
    state = {(k, s): (v.to_local().detach().numpy(), (v.placements == p.placements))
             for k, p in m.named_parameters() for s, v in opt.state[p].items()
             if isinstance(v, flow.Tensor) and v.dim()}
    return params, state


@pytest.mark.parametrize("name", _elementwise())
def test_a_step_of_shards_is_the_per_tensor_step_bit_for_bit(name):
    on = world.simulate(2, lambda r: _train(name, None, r, forbid_ops=True))
    off = world.simulate(2, lambda r: _train(name, False, r, forbid_ops=False))
    for (p_on, s_on), (p_off, s_off) in zip(on, off):
        for k in p_off:
            np.testing.assert_array_equal(p_on[k], p_off[k], err_msg=f"{name} {k}")
        assert s_on.keys() == s_off.keys()
        for k, (v, laid_out) in s_off.items():
            np.testing.assert_array_equal(s_on[k][0], v, err_msg=f"{name} state {k}")
            assert laid_out and s_on[k][1], f"{name} state {k} is not laid out as its parameter"


def test_which_optimizers_step_pieces():
    elementwise = set(_elementwise())
    assert {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Rprop", "ASGD"} <= elementwise
    assert not {"Adafactor", "Muon"} & elementwise


def test_a_partial_sum_parameter_steps_whole():
    """A parameter laid out as a partial sum (its gradient too) is no sum of pieces for Adam's
    squares: it takes the per-tensor global ops and steps as the whole tensor would (a state laid
    out as it does not let it through); fused=True, which runs on pieces, refuses it."""
    from holoflow.distributed.placement_types import Partial, Shard
    from holoflow.dtensor import distribute_tensor

    def f(r):
        mesh = DeviceMesh("cpu", [0, 1])
        w = distribute_tensor(flow.linspace(-1, 1, 6), mesh, [Partial()])   # (each rank half of it)
        p = flow.nn.Parameter(w)
        opt = flow.optim.Adam([p], lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            (p * p * p).sum().backward()
            assert p.grad.placements == p.placements
            opt.step()
        group = opt.param_groups[0]   # (state laid out as the parameter too: still not pieces)
        laid_out = {"exp_avg": p.detach() * 0, "exp_avg_sq": p.detach() * 0}
        assert all(v.placements == p.placements for v in laid_out.values())
        assert not opt._on_shards(group, [p], [p.grad], [laid_out])
        fused = flow.optim.Adam([p], lr=0.1, fused=True)
        with pytest.raises(UnsupportedError, match="parameter 0 is laid out as a partial sum .* leave fused=None"):
            fused.step()
        row = flow.nn.Parameter(distribute_tensor(flow.linspace(-1, 1, 6), mesh, [Shard(0)]))
        row.grad = row.detach() * 2
        assert opt._on_shards(group, [row], [row.grad], [{"exp_avg": row.detach() * 0}])
        return p.full_tensor().detach().numpy()
    want = flow.nn.Parameter(flow.linspace(-1, 1, 6))
    opt = flow.optim.Adam([want], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (want * want * want).sum().backward()
        opt.step()
    for got in world.simulate(2, f):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6, atol=1e-7)
