"""Differential fuzzing of ``nn.Graph``: random small training programs (random ops over the
inputs, module parameters and intermediates, a loss, ``loss.backward()``, an SGD-with-momentum or
AdamW step) run eagerly on holoflow, compiled in an ``nn.Graph`` and eagerly on torch (same
weights), for 3 steps; losses, outputs, parameters and buffers must agree. Each seed also picks a
graph config (plain, fused add-to-output, fused model update, gradient accumulation, activation
checkpointing of the program's module, AMP bf16) and a forward-only graph is checked against eager
``no_grad``. The steps are chosen by running them on torch (each is valid there, forward and
backward, for the whole batch and for the half batch of a micro-batch), so a failure names a
reproducible program (``_program(seed)`` lists it)."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.graph.passes.checkpointing import set_activation_checkpointing

# CI runs 100 programs (~15 s); HOLOFLOW_FUZZ_SEEDS=N runs N (a longer local hunt)
_FIRST = int(os.environ.get("HOLOFLOW_FUZZ_FIRST", 0))   # (a longer hunt: new seeds from here)
SEEDS = range(_FIRST, _FIRST + int(os.environ.get("HOLOFLOW_FUZZ_SEEDS", 100)))
STEPS = int(os.environ.get("HOLOFLOW_FUZZ_STEPS", 10))
BATCH, WIDTH, TRAIN_STEPS = 4, 8, 3
CONFIGS = ("plain", "fuse_add_to_output", "fuse_model_update", "grad_acc", "checkpointing", "amp")
COMBOS_FROM = 10_000   # seeds from here set a combination of configs (a longer hunt starts there)


# -- the program's module (built for either library, same structure) ------------------------------

def _net(lib):
    """The module a program runs in: its ``forward(lib, x, z, program)`` replays the steps."""
    nn = lib.nn

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(WIDTH, WIDTH)
            self.ln = nn.LayerNorm(WIDTH)
            self.bn = nn.BatchNorm1d(WIDTH)
            self.drop = nn.Dropout(p=0.0)
            self.w = nn.Parameter(lib.zeros(WIDTH, WIDTH))
            self.register_buffer("buf", lib.zeros(WIDTH))

        def forward(self, x, z, program):
            pool = [x, z, self.w]
            for name, operands, p in program:
                out = OPS[name][1](lib, self, [pool[k] for k in operands], p)
                if name not in INPLACE:
                    pool.append(out)
            return pool[3:]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = Body()

        def forward(self, x, z, program, weights):
            outs = self.body(x, z, program)
            loss = sum((t.sin() * c).mean() for t, c in zip(outs, weights)) if outs else (x * 0).sum()
            return loss, (outs[-1] if outs else x)

    return Net()


def _np_dtype() -> type:
    """NumPy's dtype of the default float dtype: float32, or float64 where a program is rerun in
    float64 (the global graph fuzzer tells float32 rounding from a bug so)."""
    return np.float64 if torch.get_default_dtype() == torch.float64 else np.float32


def _weights(lib, seed: int):
    """The module of ``seed`` on ``lib``, with the same random values on both libraries."""
    rng = np.random.default_rng(seed + 10_000)
    m = _net(lib)
    state = {k: rng.standard_normal(tuple(v.shape)).astype(_np_dtype()) * (0.4 if "weight" in k or k.endswith("w") else 0.1)
             for k, v in m.state_dict().items() if v.is_floating_point()}
    state = {k: (np.abs(v) + 0.5 if "running_var" in k else v) for k, v in state.items()}
    full = dict(m.state_dict())
    for k, v in state.items():
        full[k] = torch.tensor(v) if lib is torch else flow.tensor(v)
    m.load_state_dict(full)
    return m


# -- the instructions: name -> (arity, apply(lib, module, xs, params)) ----------------------------

def _no_grad_buffer_update(lib, m, xs, p):
    with lib.no_grad():   # a running statistic, like BatchNorm's
        m.buf.mul_(0.9).add_(xs[0].detach().mean(0) * 0.1)
    return None


def _setitem(lib, m, xs, p):
    xs[0][..., p["a"]:p["b"]] = xs[1][..., p["a"]:p["b"]] if len(xs) > 1 else p["c"]


OPS = {
    "add": (2, lambda lib, m, xs, p: xs[0] + xs[1]),
    "sub": (2, lambda lib, m, xs, p: xs[0] - xs[1]),
    "mul": (2, lambda lib, m, xs, p: xs[0] * xs[1]),
    "div": (2, lambda lib, m, xs, p: xs[0] / (xs[1].abs() + 1.0)),
    "scale": (1, lambda lib, m, xs, p: xs[0] * p["c"] + p["d"]),
    "div_c": (1, lambda lib, m, xs, p: xs[0] / p["c"]),
    "sin": (1, lambda lib, m, xs, p: xs[0].sin()),
    "tanh": (1, lambda lib, m, xs, p: lib.tanh(xs[0])),
    "exp": (1, lambda lib, m, xs, p: (xs[0].tanh() * 0.5).exp()),
    "relu": (1, lambda lib, m, xs, p: lib.relu(xs[0])),
    "gelu": (1, lambda lib, m, xs, p: lib.nn.functional.gelu(xs[0])),
    "sigmoid": (1, lambda lib, m, xs, p: xs[0].sigmoid()),
    "pow2": (1, lambda lib, m, xs, p: xs[0].tanh() ** 2),
    "linear": (1, lambda lib, m, xs, p: m.lin(xs[0])),
    "matmul_w": (1, lambda lib, m, xs, p: xs[0] @ m.w),
    "matmul": (2, lambda lib, m, xs, p: lib.matmul(xs[0], xs[1])),
    "layer_norm": (1, lambda lib, m, xs, p: m.ln(xs[0])),
    "f_layer_norm": (1, lambda lib, m, xs, p: lib.nn.functional.layer_norm(xs[0], xs[0].shape[-1:])),
    "batch_norm": (1, lambda lib, m, xs, p: m.bn(xs[0])),
    "dropout": (1, lambda lib, m, xs, p: m.drop(xs[0])),
    "sum": (1, lambda lib, m, xs, p: xs[0].sum(p["dim"], keepdim=p["keep"])),
    "mean": (1, lambda lib, m, xs, p: xs[0].mean(p["dim"], keepdim=p["keep"])),
    "amax": (1, lambda lib, m, xs, p: xs[0].amax(p["dim"], keepdim=p["keep"])),
    "softmax": (1, lambda lib, m, xs, p: lib.softmax(xs[0], p["dim"])),
    "log_softmax": (1, lambda lib, m, xs, p: lib.nn.functional.log_softmax(xs[0], dim=p["dim"])),
    "reshape": (1, lambda lib, m, xs, p: xs[0].reshape(xs[0].shape[0], -1) if p["keep"] else xs[0].reshape(-1)),
    "transpose": (1, lambda lib, m, xs, p: xs[0].transpose(p["dim"], p["d1"])),
    "permute": (1, lambda lib, m, xs, p: xs[0].permute(*p["perm"])),
    "slice": (1, lambda lib, m, xs, p: xs[0][..., p["a"]:p["b"]]),
    "slice0": (1, lambda lib, m, xs, p: xs[0][p["a"]:]),
    "unsqueeze": (1, lambda lib, m, xs, p: xs[0].unsqueeze(p["dim"])),
    "expand": (1, lambda lib, m, xs, p: xs[0].unsqueeze(-1).expand(*xs[0].shape, 2)),
    "cat": (2, lambda lib, m, xs, p: lib.cat([xs[0], xs[1]], p["dim"])),
    "stack": (2, lambda lib, m, xs, p: lib.stack([xs[0], xs[1]], p["dim"])),
    "where": (2, lambda lib, m, xs, p: lib.where(xs[0] > p["d"], xs[0], xs[1])),
    "masked_fill": (1, lambda lib, m, xs, p: xs[0].masked_fill(xs[0] < p["d"], p["c"])),
    "detach": (1, lambda lib, m, xs, p: xs[0].detach()),
    # in place (on intermediates only)
    "mul_": (1, lambda lib, m, xs, p: xs[0].mul_(p["c"])),
    "add_": (2, lambda lib, m, xs, p: xs[0].add_(xs[1])),
    "relu_": (1, lambda lib, m, xs, p: xs[0].relu_()),
    "setitem": (1, _setitem),
    "setitem_t": (2, _setitem),
    "buffer_update": (1, _no_grad_buffer_update),
}
INPLACE = {"mul_", "add_", "relu_", "setitem", "setitem_t", "buffer_update"}
N_INPUTS = 3   # x, z, body.w


def _params(name: str, x: torch.Tensor, rng: np.random.Generator) -> dict:
    nd = max(x.dim(), 1)
    last = x.shape[-1] if x.dim() else 1
    a = int(rng.integers(0, max(last, 1)))
    p = {"c": float(rng.choice([-1.5, -0.5, 0.5, 2.0])), "d": float(rng.choice([-0.3, 0.0, 0.2])),
         "dim": int(rng.integers(-nd, nd)), "d1": int(rng.integers(0, nd)), "keep": bool(rng.random() < 0.5),
         "perm": [int(i) for i in rng.permutation(x.dim())], "a": a, "b": int(rng.integers(a + 1, max(last, 1) + 1))}
    if name == "slice0":
        p["a"] = int(rng.integers(0, 2))
    if name == "unsqueeze":
        p["dim"] = int(rng.integers(0, x.dim() + 1))
    return p


def _pools(seed: int, batch: int) -> tuple:
    rng = np.random.default_rng(seed + 20_000)
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32).astype(_np_dtype())
    z = rng.standard_normal((BATCH, WIDTH)).astype(np.float32).astype(_np_dtype())
    return x[:batch], z[:batch]


def _check_torch(program: list, seed: int, batch: int) -> bool:
    """Whether ``program`` runs on torch, forward and backward, at this batch size."""
    torch.manual_seed(0)
    m = _weights(torch, seed)
    # (pieces of ``chunk`` as the eager runs feed them: views of several outputs, which torch
    # refuses to write in place while autograd records, reached through a detach() or dropout)
    x, z = (torch.tensor(v).chunk(BATCH // batch, 0)[0] for v in _pools(seed, BATCH))
    try:
        loss, out = m(x, z, program, [1.0] * len(program))
        if not torch.isfinite(loss) or not torch.isfinite(out).all():
            return False
        if loss.requires_grad:
            loss.backward()
    except Exception:
        return False
    return all(p.grad is None or torch.isfinite(p.grad).all() for p in m.parameters())


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)   # (a float64 rerun replays the program generated in float32)
def _generate(seed: int) -> tuple:
    """The program of ``seed``: steps ``(name, operand indices, params)``, the loss weights, and
    the config, optimizer and graph variants it runs under."""
    rng = np.random.default_rng(seed)
    names = list(OPS)
    program: list = []
    n_pool = N_INPUTS
    for _ in range(STEPS):
        for _try in range(30):
            name = names[int(rng.integers(0, len(names)))]
            arity = OPS[name][0]
            lo = N_INPUTS if name in INPLACE and name != "buffer_update" else 0   # not on x, z, w
            if lo >= n_pool:
                continue
            ops = (int(rng.integers(lo, n_pool)),) + ((int(rng.integers(0, n_pool)),) if arity == 2 else ())
            shapes = _shapes(program, seed)
            if name in INPLACE and name != "buffer_update" and _writes_the_parameter(shapes, ops[0]):
                # (left out: KNOWN BUG, see test_graph_detach_alias's xfail test: a training graph
                # steps the parameter before writing back the value build() wrote into it through
                # ``w.detach()``, so the step is lost. Writes through other detach()es are generated)
                continue
            if name in INPLACE and any(n in ("matmul", "matmul_w") and ops[0] in o for n, o, _ in program):
                # (left out: torch's matmul of broadcast batches saves the reshaped copies it makes,
                # so writing an operand afterwards goes unnoticed; holoflow saves the operand itself
                # and its version check refuses the backward. Eager autograd's business, not graphs')
                continue
            if name in INPLACE and len(ops) == 2 and ops[0] != ops[1] and _shares_memory(shapes, ops):
                # (left out: a write reading another view of the storage it writes, overlapping it:
                # torch's kernel reads what it already wrote, in memory order; holoflow's graph reads
                # the values before the write, as test_fuzz_views_inplace leaves it out too)
                continue
            if name == "setitem_t" and ops[0] == ops[1]:
                # (left out, not fixed: ``e[..., a:b] = e[..., a:b]`` on an expanded ``e`` is a no-op
                # copy in eager (torch skips a copy onto itself), while the graph's view_scatter
                # refuses to write the overlapping memory of the expanded tensor at run time)
                continue
            step = (name, ops, _params(name, shapes[ops[0]], rng))
            if _check_torch(program + [step], seed, BATCH) and _check_torch(program + [step], seed, BATCH // 2):
                program.append(step)
                n_pool += name not in INPLACE
                break
    n_out = n_pool - N_INPUTS
    weights = [float(w) for w in rng.choice([-1.0, 0.5, 1.0, 2.0], size=n_out)]
    config = CONFIGS[int(rng.integers(0, len(CONFIGS)))]
    opt = "sgd" if rng.random() < 0.5 else "adamw"
    if seed >= COMBOS_FROM and config != "plain":   # (one or two configs more, set together)
        others = [c for c in CONFIGS[1:] if c != config]
        config = "+".join(sorted({config, *(others[i] for i in rng.choice(len(others), size=int(rng.integers(1, 3)),
                                                                          replace=False))}))
    return program, weights, config, opt


def _shares_memory(pool: list, ops: tuple) -> bool:
    a, b = (pool[i].untyped_storage().data_ptr() for i in ops)
    return a == b


def _writes_the_parameter(pool: list, i: int) -> bool:
    """Whether pool tensor ``i`` shares memory with the parameter ``body.w`` (pool tensor 2)."""
    return pool[i].untyped_storage().data_ptr() == pool[2].untyped_storage().data_ptr()


def _shapes(program: list, seed: int) -> list:
    m = _weights(torch, seed)
    x, z = (torch.tensor(v) for v in _pools(seed, BATCH))
    pool = [x, z, m.body.w]
    with torch.no_grad():
        for name, operands, p in program:
            out = OPS[name][1](torch, m.body, [pool[k] for k in operands], p)
            if name not in INPLACE:
                pool.append(out)
    return pool


def _program(seed: int) -> str:
    program, weights, config, opt = _generate(seed)
    return "\n".join([f"  config={config} opt={opt} weights={weights}"] +
                     [f"  {n}{ops} {p}" for n, ops, p in program])


# -- the runs -----------------------------------------------------------------------------------

def _optimizer(lib, m, kind: str, amp: bool = False):
    # (under AMP a tenth of the step: bfloat16 rounding, cast where eager's autocast and the
    # graph's pass differ, would otherwise grow step by step in programs that train chaotically)
    scale = 0.1 if amp else 1.0
    if kind == "sgd":
        return lib.optim.SGD(m.parameters(), lr=0.1 * scale, momentum=0.9)
    # (eps 1e-3: a near-zero gradient is not normalized to a full step, which turns rounding noise
    # between two correct implementations into a difference of the learning rate)
    return lib.optim.AdamW(m.parameters(), lr=1e-2 * scale, weight_decay=0.1, eps=1e-3)


def _np(t) -> np.ndarray:
    """As float32 (bfloat16 values of AMP programs included), or float64 in a float64 rerun."""
    t = t._data if hasattr(t, "_data") else t
    return t.detach().to(torch.get_default_dtype()).numpy().copy()


def _state(m) -> dict:
    return {k: _np(v) for k, v in m.state_dict().items()}


def _eager(lib, seed: int, program, weights, opt_kind: str, acc: int = 1, amp: bool = False) -> tuple:
    lib.manual_seed(0)
    m = _weights(lib, seed)
    opt = _optimizer(lib, m, opt_kind, amp)
    x, z = (lib.tensor(v) for v in _pools(seed, BATCH))
    losses, outs = [], []
    for _ in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        for xc, zc in zip(x.chunk(acc, 0), z.chunk(acc, 0)):
            with lib.autocast("cpu", dtype=lib.bfloat16, enabled=amp):
                loss, out = m(xc, zc, program, weights)
            losses.append(float(loss.detach()))
            if loss.requires_grad:
                (loss / acc if acc > 1 else loss).backward()
        opt.step()
        outs.append(_np(out))   # (after the step, as the graph returns it: it may be a view of a parameter)
    return losses, outs, _state(m)


class _Train(flow.nn.Graph):
    def __init__(self, m, opt, program, weights):
        super().__init__()
        self.net, self.program, self.weights = m, program, weights
        self.add_optimizer(opt)

    def build(self, x, z):
        loss, out = self.net(x, z, self.program, self.weights)
        if loss.requires_grad:   # (as eager: a program whose loss reaches no parameter steps nothing)
            loss.backward()
        return loss, out


class _Infer(flow.nn.Graph):
    def __init__(self, m, program, weights):
        super().__init__()
        self.net, self.program, self.weights = m, program, weights

    def build(self, x, z):
        return self.net(x, z, self.program, self.weights)


def configure(g: flow.nn.Graph, config: str) -> None:
    """Sets graph config ``config`` (one of ``CONFIGS``; also ``zero1``..``zero3`` and
    ``auto_parallel`` for graphs of global tensors; several joined by "+") on the training graph ``g``."""
    for part in config.split("+"):
        _configure_one(g, part)


def _configure_one(g: flow.nn.Graph, config: str) -> None:
    if config == "fuse_add_to_output":
        g.config.allow_fuse_add_to_output(True)
    elif config == "fuse_model_update":
        g.config.allow_fuse_model_update_ops(True)
    elif config == "grad_acc":
        g.config.set_gradient_accumulation_steps(2)
    elif config == "checkpointing":
        set_activation_checkpointing(g, g.net.body)
    elif config == "amp":
        g.config.enable_amp(True, dtype=flow.bfloat16)
    elif config.startswith("zero"):
        g.config.enable_zero(True, stage=int(config[-1]), shard_min_size=1)
    elif config == "auto_parallel":
        g.config.enable_auto_parallel(True)


def _graph(seed: int, program, weights, opt_kind: str, config: str) -> tuple:
    flow.manual_seed(0)
    m = _weights(flow, seed)
    g = _Train(m, _optimizer(flow, m, opt_kind, "amp" in config.split("+")), program, weights)
    configure(g, config)
    x, z = (flow.tensor(v) for v in _pools(seed, BATCH))
    losses, outs = [], []
    for _ in range(TRAIN_STEPS):
        loss, out = g(x, z)
        losses.extend(_np(loss).reshape(-1).tolist())   # one loss per micro-batch under acc
        outs.append(_np(out))
    return losses, outs, _state(m)


def _assert_close(got: tuple, want: tuple, tol: float, what: str, outputs: bool = True) -> None:
    np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol, err_msg=f"{what}: losses")
    if outputs:
        for i, (a, b) in enumerate(zip(got[1], want[1])):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{what}: output of step {i}")
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        np.testing.assert_allclose(got[2][k], want[2][k], rtol=tol, atol=tol, err_msg=f"{what}: {k}")


def _eager_agrees_or_rounding(seed: int, program, weights, opt: str, acc: int, want: tuple) -> None:
    """holoflow's eager run equals torch's within 1e-4 in float32; where it does not, both rerun
    in float64 must agree to 1e-9: some programs amplify float32 rounding (seed 123060: a division
    by a small sum, 5e-4 apart after three SGD steps in float32, 1e-10 in float64). A wrong rule
    fails both."""
    try:
        _assert_close(want, _eager(torch, seed, program, weights, opt, acc=acc), 1e-4,
                      f"eager vs torch\n{_program(seed)}")
    except AssertionError as in_float32:
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            _assert_close(_eager(flow, seed, program, weights, opt, acc=acc),
                          _eager(torch, seed, program, weights, opt, acc=acc), 1e-9,
                          f"eager vs torch in float64\n{_program(seed)}")
        except AssertionError as in_float64:
            raise in_float64 from in_float32
        finally:
            torch.set_default_dtype(before)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_training_graph_agrees_with_eager(seed):
    program, weights, config, opt = _generate(seed)
    acc = 2 if "grad_acc" in config.split("+") else 1
    amp = "amp" in config.split("+")
    want = _eager(flow, seed, program, weights, opt, acc=acc, amp=amp)
    if not amp:   # (torch's autocast casts other ops than holoflow's: compared in fp32 only)
        _eager_agrees_or_rounding(seed, program, weights, opt, acc, want)
    got = _graph(seed, program, weights, opt, config)
    tol = 3e-2 if amp else 1e-4
    # (under accumulation the graph returns the last micro-batch's output, eager each one's)
    _assert_close(got, want, tol, f"graph vs eager\n{_program(seed)}", outputs=acc == 1)


@pytest.mark.parametrize("seed", SEEDS[::4])
def test_random_forward_graph_agrees_with_eager(seed):
    program, weights, _, _ = _generate(seed)
    flow.manual_seed(0)
    m1, m2 = _weights(flow, seed), _weights(flow, seed)
    x, z = (flow.tensor(v) for v in _pools(seed, BATCH))
    x2, z2 = (flow.tensor(v) for v in _pools(seed, BATCH))   # (a program may write its inputs)
    g = _Infer(m1, program, weights)
    for _ in range(2):
        loss, out = g(x, z)
        with flow.no_grad():
            want_loss, want_out = m2(x2, z2, program, weights)
        np.testing.assert_allclose(_np(loss), _np(want_loss), rtol=1e-5, atol=1e-5, err_msg=_program(seed))
        np.testing.assert_allclose(_np(out), _np(want_out), rtol=1e-5, atol=1e-5, err_msg=_program(seed))
    np.testing.assert_allclose(_np(x), _np(x2), rtol=1e-5, atol=1e-5, err_msg=_program(seed))
    for (k, a), b in zip(_state(m1).items(), _state(m2).values()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"{k}\n{_program(seed)}")


def test_float32_rounding_is_told_from_a_wrong_rule():
    """Seed 123060 is 5e-4 off torch in float32 and equal in float64: the float64 rerun is what
    passes it."""
    program, weights, _, opt = _generate(123060)
    want = _eager(flow, 123060, program, weights, opt)
    with pytest.raises(AssertionError):
        _assert_close(want, _eager(torch, 123060, program, weights, opt), 1e-4, "float32")
    _eager_agrees_or_rounding(123060, program, weights, opt, 1, want)
