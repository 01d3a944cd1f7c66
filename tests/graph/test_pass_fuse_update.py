"""fuse_update: the Adam/AdamW/SGD effect node becomes torch's fused multi-tensor kernel, with
the numbers of torch.optim (eager) over several steps."""
import copy

import pytest
import torch

import holoflow as flow


class Net(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = flow.nn.Linear(6, 12), flow.nn.Linear(12, 3)

    def forward(self, x):
        return self.b(flow.nn.functional.gelu(self.a(x))).pow(2).mean()


class Train(flow.nn.Graph):
    def __init__(self, m, opt, fuse):
        super().__init__()
        self.m = m
        self.add_optimizer(opt)
        self.config.allow_fuse_model_update_ops(fuse)

    def build(self, x):
        loss = self.m(x)
        loss.backward()
        return loss


@pytest.mark.parametrize("cls,kw", [(flow.optim.Adam, {}), (flow.optim.AdamW, {"weight_decay": 0.1}),
                                    (flow.optim.Adam, {"amsgrad": True, "weight_decay": 0.01}),
                                    (flow.optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}),
                                    (flow.optim.SGD, {"momentum": 0.9, "nesterov": True}),
                                    (flow.optim.SGD, {})])
def test_fused_update_matches_torch(cls, kw):
    flow.manual_seed(0)
    m = Net()
    tm = torch.nn.Sequential()  # torch twin with the same weights
    tm.a, tm.b = torch.nn.Linear(6, 12), torch.nn.Linear(12, 3)
    tm.load_state_dict({k: v.to_torch() for k, v in m.state_dict().items()})
    opt = cls(m.parameters(), lr=1e-2, **kw)
    topt = getattr(torch.optim, cls.__name__)(tm.parameters(), lr=1e-2, **kw)
    g = Train(m, opt, fuse=True)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(5, 6, generator=gen)
        loss = g(flow.from_torch(x))
        tloss = tm.b(torch.nn.functional.gelu(tm.a(x))).pow(2).mean()
        topt.zero_grad()
        tloss.backward()
        topt.step()
        torch.testing.assert_close(loss.to_torch(), tloss.detach(), rtol=1e-5, atol=1e-6)
    for (k, v), (_tk, tv) in zip(m.state_dict().items(), tm.state_dict().items()):
        torch.testing.assert_close(v.to_torch(), tv, rtol=1e-5, atol=1e-6, msg=lambda s, k=k: f"{k}: {s}")
    ir = next(iter(g._compiled.values())).ir
    assert [n.op for n in ir.nodes if n.effect] == [f"fused_{cls.__name__.lower()}_update"]


def test_off_keeps_foreach_update_and_an_optimizer_without_a_fused_kernel_is_untouched():
    m = Net()
    g = Train(m, flow.optim.Adam(m.parameters()), fuse=False)
    g(flow.randn(5, 6))
    assert [n.op for n in next(iter(g._compiled.values())).ir.nodes if n.effect] == ["adam_update"]
    m2 = copy.deepcopy(m)
    g2 = Train(m2, flow.optim.RMSprop(m2.parameters(), lr=0.1), fuse=True)
    g2(flow.randn(5, 6))
    assert [n.op for n in next(iter(g2._compiled.values())).ir.nodes if n.effect] == ["rmsprop_update"]


def test_fused_update_on_a_global_graph_equals_local():
    """On two simulated ranks (broadcast weights, a batch split in two) the fused AdamW update
    trains to the numbers of one process's fused graph."""
    from holoflow.distributed import world
    flow.manual_seed(0)
    init = Net().state_dict()
    xs = [torch.randn(4, 6, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def losses(place):
        m = Net()
        m.load_state_dict(init)
        if place is not None:
            m.to_global(place, flow.sbp.broadcast)
        g = Train(m, flow.optim.AdamW(m.parameters(), lr=1e-2), fuse=True)
        out = []
        for x in xs:
            x = flow.from_torch(x.clone())
            if place is not None:
                x = x.to_global(place, flow.sbp.broadcast).to_global(sbp=flow.sbp.split(0))
            loss = g(x)
            out.append((loss.to_global(sbp=flow.sbp.broadcast).to_local() if place is not None else loss).item())
        assert [n.op for n in next(iter(g._compiled.values())).ir.nodes if n.effect] == ["fused_adamw_update"]
        return out
    want = losses(None)
    for got in world.simulate(2, lambda r: losses(flow.placement("cpu", [0, 1]))):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)

class _AdamSign(flow.optim.Adam):
    """A subclass that rewrites Adam's rule: Adam's fused kernel no longer implements it."""

    def _update(self, V, group, params, grads, states):
        super()._update(V, group, params, [g.sign() for g in grads], states)


class _Halving(flow.optim.SGD):
    """An optimizer declaring its own fused lowering (here: a plain torch call)."""

    @staticmethod
    def fused_update(group, params, grads, states):
        torch._foreach_add_([p._data for p in params], [g._data for g in grads], alpha=-group["lr"])


def test_the_pass_asks_the_declared_lowering_not_the_class():
    m = Net()
    g = Train(m, _Halving(m.parameters(), lr=0.1), fuse=True)
    g(flow.randn(5, 6))
    assert [n.op for n in next(iter(g._compiled.values())).ir.nodes if n.effect] == ["fused__halving_update"]
    m2 = Net()
    g2 = Train(m2, _AdamSign(m2.parameters()), fuse=True)
    g2(flow.randn(5, 6))
    assert [n.op for n in next(iter(g2._compiled.values())).ir.nodes if n.effect] == ["_adamsign_update"]
