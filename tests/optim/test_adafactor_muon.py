"""Adafactor and Muon (torch 2.13) against torch.optim: parameters and state after every step on the
same initial weights and gradients (option sets, two parameter groups, foreach on and off, float32
and float64, 0-, 1-, 2- and 3-D parameters), state_dict round trips and torch's state dicts,
torch's defaults and errors, global parameters on simulated ranks, and nn.Graph steps.

Weights and gradients come from numpy (simulated ranks are threads sharing torch's RNG)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.core.errors import UnsupportedError
from holoflow.distributed import world
from holoflow.graph import Graph
from holoflow.sbp import B, S

RNG = np.random.default_rng(7)
SHAPES = {"mat": (4, 3), "cube": (2, 5, 3), "vec": (3,), "scalar": ()}
INIT = {k: RNG.standard_normal(s) for k, s in SHAPES.items()}
GRADS = [{k: RNG.standard_normal(s) for k, s in SHAPES.items()} for _ in range(6)]

ADAFACTOR = [
    dict(), dict(foreach=True), dict(foreach=False),
    dict(lr=0.5, weight_decay=0.1, maximize=True),
    dict(lr=0.05, beta2_decay=-0.5, eps=(1e-6, 1e-2), d=2.0, foreach=True, weight_decay=0.2),
    dict(eps=(1e-8, 1e-3), d=1.5, foreach=False),
    dict(groups=True), dict(groups=True, foreach=True),
]
MUON = [
    dict(), dict(lr=0.02, nesterov=False), dict(lr=0.02, momentum=0.5, weight_decay=0.0),
    dict(lr=0.01, adjust_lr_fn="match_rms_adamw"), dict(lr=0.01, adjust_lr_fn="original", ns_steps=3),
    dict(lr=0.01, ns_coefficients=(2.0, -1.5, 0.5), eps=1e-3), dict(groups=True),
]


def _params(lib, name: str, dtype: str) -> dict:
    keys = ["mat", "cube", "vec", "scalar"] if name == "Adafactor" else ["mat"]
    out = {k: lib.nn.Parameter(lib.tensor(INIT[k].astype(dtype))) for k in keys}
    if name == "Muon":   # a tall, a wide and a square matrix: Newton-Schulz transposes the tall one
        out["wide"] = lib.nn.Parameter(lib.tensor(INIT["mat"].T.copy().astype(dtype)))
        out["square"] = lib.nn.Parameter(lib.tensor(INIT["cube"][0, :3].copy().astype(dtype)))
    return out


def _grad(lib, name: str, i: int, dtype: str):
    g = GRADS[i]
    extra = {"wide": g["mat"].T.copy(), "square": g["cube"][1, :3].copy()}
    return lib.tensor((g.get(name, extra.get(name))).astype(dtype))


def _make(lib, name: str, params: dict, options: dict):
    options = dict(options)
    ps = list(params.values())
    if options.pop("groups", False):
        lr = 1e-2 if name == "Adafactor" else 1e-3
        ps = [{"params": ps[:1]}, {"params": ps[1:], "lr": lr * 3, "weight_decay": 0.05}]
    return getattr(lib.optim, name)(ps, **options)


def _train(lib, name: str, options: dict, dtype: str = "float32", steps: int = 6, round_trip_at: int | None = None):
    params = _params(lib, name, dtype)
    opt = _make(lib, name, params, options)
    history = []
    for i in range(steps):
        for k, p in params.items():
            p.grad = _grad(lib, k, i, dtype)
        opt.step()
        history.append({k: p.detach().numpy().copy() for k, p in params.items()})
        if i == round_trip_at:
            sd = opt.state_dict()
            opt = _make(lib, name, params, options)
            opt.load_state_dict(sd)
    return history, opt


def _np(v):
    return v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)


def _same_state(fopt, topt, rtol: float, atol: float) -> None:
    fsd, tsd = fopt.state_dict(), topt.state_dict()
    assert fsd["param_groups"] == tsd["param_groups"]
    assert set(fsd["state"]) == set(tsd["state"])
    for k, tst in tsd["state"].items():
        fst = fsd["state"][k]
        assert set(fst) == set(tst)
        for key, v in tst.items():
            assert tuple(fst[key].shape) == tuple(v.shape), key
            assert str(fst[key].dtype).split(".")[-1] == str(v.dtype).split(".")[-1], key
            np.testing.assert_allclose(_np(fst[key]), _np(v), rtol=rtol, atol=atol, err_msg=key)


CASES = [("Adafactor", o) for o in ADAFACTOR] + [("Muon", o) for o in MUON]
IDS = [f"{n}-{i}" for i, (n, _) in enumerate(CASES)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_steps_and_state_match_torch(name, options, dtype):
    want, topt = _train(torch, name, options, dtype)
    got, fopt = _train(flow, name, options, dtype)
    # local eager steps run torch's kernels in torch's order; the holoflow-ops path (foreach=False)
    # rounds a lerp differently (ops/elementwise.lerp is a composite)
    tol = dict(rtol=1e-5, atol=1e-6) if options.get("foreach") is False else dict(rtol=0, atol=0)
    moved = False
    for step, (w, g) in enumerate(zip(want, got)):
        for k in w:
            np.testing.assert_allclose(g[k], w[k], err_msg=f"step {step} {k}", **tol)
            moved |= not np.array_equal(w[k], INIT.get(k, w[k]))
    assert moved
    _same_state(fopt, topt, **tol)


@pytest.mark.parametrize("name,options", CASES, ids=IDS)
def test_state_dict_round_trip_continues_like_torch(name, options):
    want, _ = _train(torch, name, options, round_trip_at=2)
    got, fopt = _train(flow, name, options, round_trip_at=2)
    tol = dict(rtol=1e-5, atol=1e-6) if options.get("foreach") is False else dict(rtol=0, atol=0)
    for k in want[-1]:
        np.testing.assert_allclose(got[-1][k], want[-1][k], **tol)


@pytest.mark.parametrize("name,options", [("Adafactor", ADAFACTOR[3]), ("Adafactor", ADAFACTOR[6]),
                                          ("Muon", MUON[1]), ("Muon", MUON[6])], ids=["A3", "A6", "M1", "M6"])
def test_load_torch_state_dict_and_continue(name, options):
    _, topt = _train(torch, name, options, steps=3)
    tparams = [p for g in topt.param_groups for p in g["params"]]
    fparams = {str(i): flow.nn.Parameter(flow.from_torch(p.detach().clone())) for i, p in enumerate(tparams)}
    fopt = _make(flow, name, fparams, options)
    fopt.load_state_dict(topt.state_dict())
    assert isinstance(next(iter(fopt.state[fparams["0"]].values())), flow.Tensor)
    keys = list(_params(torch, name, "float32"))
    for i in range(3, 6):
        for k, tp, fp in zip(keys, tparams, fparams.values()):
            tp.grad = _grad(torch, k, i, "float32")
            fp.grad = _grad(flow, k, i, "float32")
        topt.step()
        fopt.step()
    for tp, fp in zip(tparams, fparams.values()):
        np.testing.assert_array_equal(fp.detach().numpy(), tp.detach().numpy())
    _same_state(fopt, topt, rtol=0, atol=0)


def test_tensor_lr_like_torch():
    for name in ("Adafactor", "Muon"):
        out = []
        for lib in (torch, flow):
            params = _params(lib, name, "float64")
            opt = getattr(lib.optim, name)(list(params.values()), lr=lib.tensor([0.05], dtype=lib.float64))
            for i in range(3):
                for k, p in params.items():
                    p.grad = _grad(lib, k, i, "float64")
                opt.step()
            out.append({k: p.detach().numpy() for k, p in params.items()})
        for k in out[0]:
            np.testing.assert_allclose(out[1][k], out[0][k], rtol=1e-6, atol=1e-7, err_msg=f"{name} {k}")


def test_defaults_and_signatures_match_torch():
    import inspect
    for name in ("Adafactor", "Muon"):
        tp = [torch.nn.Parameter(torch.zeros(2, 2))]
        fp = [flow.nn.Parameter(flow.zeros(2, 2))]
        assert getattr(flow.optim, name)(fp).defaults == getattr(torch.optim, name)(tp).defaults, name
        tsig = inspect.signature(getattr(torch.optim, name).__init__)
        fsig = inspect.signature(getattr(flow.optim, name).__init__)
        assert [(p.name, p.kind, p.default) for p in fsig.parameters.values()] == \
            [(p.name, p.kind, p.default) for p in tsig.parameters.values()], name
    assert "Adafactor" in flow.optim.__all__ and "Muon" in flow.optim.__all__


BAD = [
    ("Adafactor", dict(lr=-0.1)), ("Adafactor", dict(beta2_decay=0.5)), ("Adafactor", dict(eps=(-1.0, 1e-3))),
    ("Adafactor", dict(eps=(None, -1e-3))), ("Adafactor", dict(d=0.5)), ("Adafactor", dict(weight_decay=-1.0)),
    ("Adafactor", dict(lr=[0.1, 0.2])),
    ("Muon", dict(lr=-1.0)), ("Muon", dict(momentum=-0.1)), ("Muon", dict(weight_decay=-0.1)),
    ("Muon", dict(adjust_lr_fn="spectral")), ("Muon", dict(lr=[0.1, 0.2])),
]


@pytest.mark.parametrize("name,kw", BAD, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD)])
def test_invalid_options_raise_value_error_like_torch(name, kw):
    kw = dict(kw)
    as_tensor = isinstance(kw.get("lr"), list)
    with pytest.raises(ValueError):
        getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(2, 2))],
                                   **(dict(kw, lr=torch.tensor(kw["lr"])) if as_tensor else kw))
    with pytest.raises(ValueError, match=f"^holoflow.optim.{name}: "):
        getattr(flow.optim, name)([flow.nn.Parameter(flow.zeros(2, 2))],
                                  **(dict(kw, lr=flow.tensor(kw["lr"])) if as_tensor else kw))


def test_muon_refuses_what_torch_refuses():
    for lib in (torch, flow):
        prefix = "^holoflow.optim.Muon: " if lib is flow else ""
        with pytest.raises(ValueError, match=prefix + "Muon only supports 2D parameters"):
            lib.optim.Muon([lib.nn.Parameter(lib.zeros(2, 2)), lib.nn.Parameter(lib.zeros(3))])
        # a group added later is not checked at construction; its step refuses the gradient
        opt = lib.optim.Muon([lib.nn.Parameter(lib.zeros(2, 2))])
        b = lib.nn.Parameter(lib.zeros(3))
        opt.add_param_group({"params": [b]})
        b.grad = lib.ones(3)
        with pytest.raises(ValueError, match=prefix + "Param gradient must be a 2D matrix"):
            opt.step()
        for bad, msg in ((dict(ns_steps=100), "must be less than 100"), (dict(ns_coefficients=(1.0, 2.0)), "3 values")):
            p = lib.nn.Parameter(lib.ones(2, 2))
            p.grad = lib.ones(2, 2)
            with pytest.raises(ValueError, match=msg):
                lib.optim.Muon([p], **bad).step()
        c = lib.nn.Parameter(lib.zeros(2, 2, dtype=lib.complex64))
        c.grad = lib.ones(2, 2, dtype=lib.complex64)
        with pytest.raises(RuntimeError, match="does not support complex parameters"):
            lib.optim.Muon([c]).step()


def test_adafactor_refuses_complex_like_torch():
    for lib in (torch, flow):
        c = lib.nn.Parameter(lib.zeros(3, dtype=lib.complex64))
        c.grad = lib.ones(3, dtype=lib.complex64)
        with pytest.raises(RuntimeError, match="Adafactor does not support complex parameters"):
            lib.optim.Adafactor([c]).step()


def test_lr_scheduler_drives_adafactor_and_muon_like_torch():
    def run(lib, name):
        params = _params(lib, name, "float64")
        opt = getattr(lib.optim, name)(list(params.values()), lr=0.05)
        sch = lib.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        for i in range(5):
            for k, p in params.items():
                p.grad = _grad(lib, k, i, "float64")
            opt.step()
            sch.step()
        return {k: p.detach().numpy() for k, p in params.items()}, opt.param_groups[0]["lr"]
    for name in ("Adafactor", "Muon"):
        (tw, tlr), (fw, flr) = run(torch, name), run(flow, name)
        assert flr == tlr
        for k in tw:
            np.testing.assert_array_equal(fw[k], tw[k])


# -- global parameters (eager, simulated ranks) --------------------------------------------------

def _global_run(rank: int, name: str, sbp, options: dict) -> dict:
    place = flow.placement("cpu", [0, 1])
    params = {k: flow.nn.Parameter(flow.tensor(INIT[k].astype("float64")).to_global(place, B).to_global(sbp=sbp)
                                   if len(SHAPES[k]) > (sbp.axis if sbp != B else -1) else
                                   flow.tensor(INIT[k].astype("float64")).to_global(place, B))
              for k in (["mat", "cube", "vec"] if name == "Adafactor" else ["mat"])}
    opt = getattr(flow.optim, name)(list(params.values()), **options)
    for i in range(4):
        for k, p in params.items():
            p.grad = _grad(flow, k, i, "float64").to_global(place, B).to_global(sbp=p._global.sbp)
        opt.step()
    assert all(p._global is not None for p in params.values())
    return {k: p.detach().to_global(sbp=B).to_local().numpy() for k, p in params.items()}


@pytest.mark.parametrize("sbp", [B, S(0), S(1)], ids=["B", "S0", "S1"])
@pytest.mark.parametrize("name,options", [("Adafactor", dict(lr=0.1, weight_decay=0.1)),
                                          ("Muon", dict(lr=0.02))], ids=["Adafactor", "Muon"])
def test_global_parameters_step_like_torch(name, options, sbp):
    params = {k: torch.nn.Parameter(torch.tensor(INIT[k])) for k in (["mat", "cube", "vec"] if name == "Adafactor" else ["mat"])}
    opt = getattr(torch.optim, name)(list(params.values()), **options)
    for i in range(4):
        for k, p in params.items():
            p.grad = _grad(torch, k, i, "float64")
        opt.step()
    for rank, got in enumerate(world.simulate(2, lambda r: _global_run(r, name, sbp, options))):
        for k, p in params.items():
            # (a sharded norm may sum in another order; Muon's bfloat16 iteration would amplify it)
            tol = 1e-12 if name == "Adafactor" else 1e-6
            np.testing.assert_allclose(got[k], p.detach().numpy(), rtol=tol, atol=tol, err_msg=f"rank {rank} {k}")


# -- nn.Graph ------------------------------------------------------------------------------------

class _Train(Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = ((self.model(x) - y) ** 2).mean()
        loss.backward()
        return loss


def _model(name: str, options: dict):
    flow.manual_seed(0)
    m = flow.nn.Linear(3, 4, bias=name == "Adafactor")
    return m, getattr(flow.optim, name)(m.parameters(), **options)


@pytest.mark.parametrize("name,options", [("Adafactor", {}), ("Adafactor", dict(foreach=True, weight_decay=0.1)),
                                          ("Adafactor", dict(foreach=False)), ("Muon", dict(lr=0.02))],
                         ids=["Adafactor", "Adafactor-foreach", "Adafactor-ops", "Muon"])
def test_graph_steps_equal_eager(name, options):
    x, y = flow.tensor(RNG.standard_normal((5, 3)).astype("float32")), flow.tensor(RNG.standard_normal((5, 4)).astype("float32"))
    m, opt = _model(name, options)
    eager = []
    for _ in range(4):
        opt.zero_grad()
        loss = ((m(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        eager.append(loss.item())
    gm, gopt = _model(name, options)
    g = _Train(gm, gopt)
    graph = [g(x, y).item() for _ in range(4)]
    np.testing.assert_allclose(graph, eager, rtol=1e-6, atol=1e-7)
    for p, q in zip(m.parameters(), gm.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert eager[-1] < eager[0]
    assert sorted(gopt.state_dict()["state"][0]) == sorted(opt.state_dict()["state"][0])


def _graph_global(rank: int, name: str) -> str:
    place = flow.placement("cpu", [0, 1])
    m = flow.nn.Linear(3, 4, bias=False).to_global(place, B)
    m.weight = flow.nn.Parameter(m.weight.detach().to_global(sbp=S(0)))
    g = _Train(m, getattr(flow.optim, name)(m.parameters()))
    x = flow.ones(5, 3).to_global(place, B)
    try:
        g(x, flow.zeros(5, 4).to_global(place, B))
    except Exception as e:   # the plan's error names the effect's failure
        return f"{type(e).__name__}: {e}" + ("" if e.__cause__ is None else f" / {type(e.__cause__).__name__}: {e.__cause__}")
    return "no error"


@pytest.mark.parametrize("name", ["Adafactor", "Muon"])
def test_graph_refuses_shards_of_global_parameters(name):
    # the effect would step each rank's shard: norms and products of pieces are not the rule
    for msg in world.simulate(2, lambda r: _graph_global(r, name)):
        assert f"holoflow.optim.{name}: nn.Graph cannot run {name}'s update on pieces" in msg, msg
    assert issubclass(UnsupportedError, Exception)


def _graph_replicated(rank: int, name: str, options: dict, x: np.ndarray, y: np.ndarray, init: dict) -> tuple:
    """Three graph steps of a broadcast (data-parallel) model on row-split batches, then one eager step.
    The initial weights come from the caller: simulated ranks are threads sharing one default
    generator, so two ranks seeding and drawing at once interleave their draws."""
    place = flow.placement("cpu", [0, 1])
    m, opt = _model(name, options)
    with flow.no_grad():
        for k, p in m.named_parameters():
            p.copy_(flow.tensor(init[k]))
    m.to_global(place, B)
    g = _Train(m, opt)
    for _ in range(3):
        g(flow.tensor(x).to_global(place, S(0)), flow.tensor(y).to_global(place, S(0)))
    after_graph = [p.detach().to_global(sbp=B).to_local().numpy().copy() for p in m.parameters()]
    opt.zero_grad()
    ((m(flow.tensor(x).to_global(place, B)) - flow.tensor(y).to_global(place, B)) ** 2).mean().backward()
    opt.step()
    return after_graph, [p.detach().to_global(sbp=B).to_local().numpy().copy() for p in m.parameters()]


@pytest.mark.parametrize("name,options", [("Adafactor", {}), ("Adafactor", dict(foreach=False, weight_decay=0.1)),
                                          ("Muon", dict(lr=0.02))], ids=["Adafactor", "Adafactor-ops", "Muon"])
def test_graph_steps_replicated_global_parameters_like_eager(name, options):
    # a broadcast parameter's shard is the whole tensor: the graph steps each replica, and eager
    # steps after graph steps go on from the state the graph made
    x, y = RNG.standard_normal((6, 3)).astype("float32"), RNG.standard_normal((6, 4)).astype("float32")
    m, opt = _model(name, options)
    history = []
    for _ in range(4):
        opt.zero_grad()
        ((m(flow.tensor(x)) - flow.tensor(y)) ** 2).mean().backward()
        opt.step()
        history.append([p.detach().numpy().copy() for p in m.parameters()])
    init = {k: p.detach().numpy().copy() for k, p in _model(name, options)[0].named_parameters()}
    for after_graph, after_eager in world.simulate(2, lambda r: _graph_replicated(r, name, options, x, y, init)):
        for got, want in zip(after_graph, history[2]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        for got, want in zip(after_eager, history[3]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,options", [("Adafactor", ADAFACTOR[6]), ("Muon", MUON[6])], ids=["Adafactor", "Muon"])
def test_state_dict_saved_to_a_file_continues_like_torch(name, options, tmp_path):
    _, topt = _train(torch, name, options, steps=3)
    _, fopt = _train(flow, name, options, steps=3)
    torch.save(topt.state_dict(), tmp_path / "t.pt")
    flow.save(fopt.state_dict(), tmp_path / "f.pt")
    results = []
    for lib, path in ((torch, tmp_path / "t.pt"), (flow, tmp_path / "f.pt")):
        history, _ = _train(lib, name, options, steps=3)
        params = _params(lib, name, "float32")
        for p, v in zip(params.values(), history[-1].values()):
            with lib.no_grad():
                p.copy_(lib.tensor(v))
        opt = _make(lib, name, params, options)
        opt.load_state_dict(lib.load(path))
        for i in range(3, 6):
            for k, p in params.items():
                p.grad = _grad(lib, k, i, "float32")
            opt.step()
        results.append({k: p.detach().numpy() for k, p in params.items()})
    for k in results[0]:
        np.testing.assert_array_equal(results[1][k], results[0][k])
