"""The optimizers' ``step`` counters, packed into one buffer per group (one increment kernel per
step instead of one per parameter), against torch.optim: the counters' values after steps where
some parameters had no gradient, after ``load_state_dict``, ``deepcopy`` and a user's assignment,
and the parameters they drive (Adam's bias correction reads them)."""
import copy

import numpy as np
import pytest
import torch

import holoflow as flow

RNG = np.random.default_rng(3)
INITS = [RNG.standard_normal(s).astype(np.float32) for s in ((3, 4), (4,), (2, 3), (5,))]
OPTIMIZERS = [("AdamW", dict(lr=0.05)), ("AdamW", dict(lr=0.05, fused=True)),
              ("Adam", dict(lr=0.05, foreach=False)), ("Adagrad", dict(lr=0.1)), ("Adagrad", dict(lr=0.1, fused=True)), ("RMSprop", dict(lr=0.01)),
              ("Rprop", dict(lr=0.01)), ("ASGD", dict(lr=0.05))]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)]


def _params(lib):
    return [lib.nn.Parameter(lib.tensor(a.copy())) for a in INITS]


def _step(lib, opt, ps, skip=()):
    """One step where the parameters at ``skip`` get no gradient (a subset of the group steps)."""
    opt.zero_grad(set_to_none=True)
    loss = sum(((p * (i + 1.0)) ** 2).sum() for i, p in enumerate(ps) if i not in skip)
    loss.backward()
    opt.step()


def _steps(opt) -> list[float]:
    return [float(opt.state[p]["step"]) for g in opt.param_groups for p in g["params"] if p in opt.state]


def _both(name, kw, program):
    got = []
    for lib in (flow, torch):
        ps = _params(lib)
        opt = getattr(lib.optim, name)(ps, **kw)
        got.append((program(lib, opt, ps), [p.detach().numpy().copy() for p in ps]))
    (steps_f, ps_f), (steps_t, ps_t) = got
    assert steps_f == steps_t
    for a, b in zip(ps_f, ps_t):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=IDS)
def test_counters_with_parameters_skipped_in_some_steps(name, kw):
    def program(lib, opt, ps):
        _step(lib, opt, ps)
        _step(lib, opt, ps, skip=(1,))
        _step(lib, opt, ps, skip=(0, 3))
        _step(lib, opt, ps)
        return _steps(opt)
    _both(name, kw, program)


@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=IDS)
def test_counters_after_load_state_dict_and_deepcopy(name, kw):
    def program(lib, opt, ps):
        _step(lib, opt, ps)
        _step(lib, opt, ps)
        saved = copy.deepcopy(opt.state_dict())
        twin = copy.deepcopy(opt)
        _step(lib, opt, ps)
        opt.load_state_dict(saved)   # back to step 2
        _step(lib, opt, ps)
        return _steps(opt) + [float(st["step"]) for st in twin.state.values()]
    _both(name, kw, program)


def test_a_counter_assigned_by_the_user_is_stepped_from_its_new_value():
    def program(lib, opt, ps):
        _step(lib, opt, ps)
        opt.state[ps[2]]["step"] = lib.tensor(10.0)
        _step(lib, opt, ps)
        opt.state[ps[0]]["step"].fill_(4.0)   # in place, through the packed view
        _step(lib, opt, ps)
        return _steps(opt)
    _both("AdamW", dict(lr=0.05), program)


def test_a_group_increments_its_counters_with_one_kernel():
    ps = _params(flow)
    opt = flow.optim.AdamW(ps, lr=0.05)
    _step(flow, opt, ps)
    counters = [opt.state[p]["step"] for p in ps]
    buffers = {c._data._base.data_ptr() for c in counters}
    assert len(buffers) == 1 and counters[0]._data._base.shape == (len(ps),)
    _step(flow, opt, ps)
    assert [float(c) for c in counters] == [2.0] * len(ps)
    assert {c._data._base.data_ptr() for c in counters} == buffers   # packed once, not per step


def test_counters_in_a_graph_step_equal_eager():
    from holoflow.graph import Graph
    got = []
    for graph in (False, True):
        ps = _params(flow)
        opt = flow.optim.AdamW(ps, lr=0.05)

        def train():
            opt.zero_grad(set_to_none=True)
            loss = sum(((p * 2.0) ** 2).sum() for p in ps)
            loss.backward()
            opt.step()
            return loss

        if graph:
            class G(Graph):
                def __init__(self):
                    super().__init__()
                    self.add_optimizer(opt)

                def build(self):
                    loss = sum(((p * 2.0) ** 2).sum() for p in ps)
                    loss.backward()
                    return loss
            g = G()
            g.config.allow_fuse_model_update_ops(True)
            train = g   # noqa: F811
        for _ in range(3):
            train()
        got.append(([float(opt.state[p]["step"]) for p in ps], [p.detach().numpy().copy() for p in ps]))
    assert got[0][0] == got[1][0] == [3.0] * len(INITS)
    for a, b in zip(got[0][1], got[1][1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
