"""Functions run on every rank of the Gloo worlds (tests/dist/pool.py) by test_global_dist.py."""
import itertools

import torch

import holoflow as flow
from holoflow.distributed.comm_track import count
from holoflow.distributed.global_tensor import make_global
from holoflow.distributed.sharding import shard_of
from holoflow.sbp import B, P, S


def partial_of(full: torch.Tensor, place, nd, rank: int):
    """A P tensor whose shards differ but sum to ``full``."""
    local = shard_of(full, tuple(B if s == P else s for s in nd), place, rank).clone()
    coords = place.coords(rank)
    for a, s in enumerate(nd):
        if s == P:
            p = place.hierarchy[a]
            local *= (coords[a] + 1) / (p * (p + 1) / 2)
    return make_global(flow.from_torch(local), place, nd, full.shape)


def box_pairs(rank: int, ranks, shape, sbps):
    """Every (src, dst) pair: the local result, the gathered whole, and the collectives used."""
    place = flow.placement("cpu", ranks)
    gen = torch.Generator().manual_seed(0)
    full = torch.randn(shape, generator=gen, dtype=torch.float64)
    out = []
    for src, dst in itertools.product(sbps, sbps):
        x = partial_of(full, place, src, rank)
        with count() as c:
            y = x.to_global(sbp=dst)
        whole = y.to_global(sbp=(B,) * place.ndim).to_local().to_torch()
        out.append((src, dst, y.to_local().to_torch(), whole, dict(c.counts)))
    return out


def globalize(x: torch.Tensor, place, nd, rank: int, grad: bool):
    g = partial_of(x.double() if x.is_floating_point() else x, place, nd, rank) if P in nd else \
        make_global(flow.from_torch(shard_of(x, nd, place, rank).clone()), place, nd, x.shape)
    if x.is_floating_point():
        g = g.to(flow.from_torch(x).dtype) if g.dtype != flow.from_torch(x).dtype else g
        if grad:
            g.requires_grad_(True)
    return g


def sbp_choices(x: torch.Tensor, ndim: int):
    one = [B] + [S(a) for a in range(x.dim()) if x.shape[a] > 0]
    if x.is_floating_point():
        one.append(P)
    return [c for c in itertools.product(one, repeat=ndim)]


def op_case_names(module: str, step: int, at_least: int = 1) -> list[str]:
    """Every ``step``-th case of an op-table module (more often where that would give fewer than
    ``at_least``: a small table sampled sparsely is a sample of two, whose checks on proportions
    flip when a case is added), leaving out what cannot be globalized: random cases (each rank's
    RNG draws for its own shard)."""
    import importlib
    mod = importlib.import_module(module)
    names = [c.name for c in mod.CASES if not c.random]
    return names[::max(1, min(step, len(names) // at_least))]


def op_case_names_per_op(module: str, per_op: int) -> list[str]:
    """Up to ``per_op`` cases of each op of an op-table module, spread over its cases (its first
    and last among them: a table lists an op's plain case first and its rarer options last), for
    tables whose every case would cost too much on rank processes (random cases left out, as in
    :func:`op_case_names`)."""
    import importlib
    import re
    groups: dict = {}
    for c in importlib.import_module(module).CASES:
        if not c.random:
            groups.setdefault(re.split(r"[{\[(-]", c.name, maxsplit=1)[0], []).append(c.name)
    names = []
    for group in groups.values():
        k = min(per_op, len(group))
        picks = sorted({round(i * (len(group) - 1) / max(k - 1, 1)) for i in range(k)})
        names += [group[i] for i in picks]
    return names


def _second_order(outs, ins, ups, gen):
    """Gradients of ``sum(grad_i * v_i)`` w.r.t. ``ins``, where ``grad_i`` are the input gradients
    for upstream ``ups`` taken with ``create_graph=True`` and ``v_i`` fixed random tensors: a
    double backward through every input gradient that depends on the inputs (None elsewhere)."""
    gs = flow.autograd.grad(outs, ins, ups, create_graph=True, allow_unused=True)
    terms = [(g * flow.from_torch(torch.randn(tuple(g.shape), generator=gen, dtype=torch.float64)).to(
        g.dtype).to_global(g.placement, (B,) * len(g.sbp)) if g._global is not None else
        g * flow.from_torch(torch.randn(tuple(g.shape), generator=gen, dtype=torch.float64)).to(g.dtype)).sum()
        for g in gs if g is not None and g.requires_grad]
    if not terms:
        return None
    return flow.autograd.grad([sum(terms)], ins, allow_unused=True)


def run_op_cases(rank: int, ranks, module: str, names, combos: int, order: int = 1):
    """Each named op-table case under ``combos`` random SBP assignments of its inputs, against
    the single-process result (values, then input gradients for a fixed upstream gradient; with
    ``order=2`` also second-order gradients, :func:`_second_order`, for the cases whose local
    double backward runs). Returns (checked, failures, cases whose function closes over local
    tensors)."""
    import importlib

    from harness import leaves, to_flow
    mod = importlib.import_module(module)
    cases = {c.name: c for c in mod.CASES}
    place = flow.placement("cpu", ranks)
    failures, checked, local_only = [], 0, []
    for name in names:
        case = cases[name]
        gen = torch.Generator().manual_seed(0)
        args, kwargs = case.make(torch.float64, gen)
        fargs, fkw = to_flow(args, case.grad), to_flow(kwargs, case.grad)
        want = case.flow_fn(*fargs, **fkw)
        w_outs = [o for o in leaves(want)]
        w_ins = [x for x in leaves((fargs, fkw)) if x.requires_grad]
        ups = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o._data.dtype) for o in w_outs
               if o.requires_grad]
        w_grads = flow.autograd.grad([o for o in w_outs if o.requires_grad], w_ins,
                                     [flow.from_torch(u) for u in ups], allow_unused=True) \
            if ups and w_ins else []
        w_second = None
        if order == 2 and ups and w_ins:
            try:
                want = case.flow_fn(*fargs, **fkw)   # (a fresh graph: the first one was freed)
                w_second = _second_order([o for o in leaves(want) if o.requires_grad], w_ins,
                                         [flow.from_torch(u) for u in ups], torch.Generator().manual_seed(7))
            except Exception:   # no local double backward for this op: nothing to compare with
                w_second = None
        tens = [x for x in leaves((args, kwargs))]
        rng = torch.Generator().manual_seed(len(name))
        for _ in range(combos):
            nds = []
            for t in tens:
                ch = sbp_choices(t, place.ndim)
                nds.append(ch[int(torch.randint(len(ch), (1,), generator=rng))])
            it = iter(nds)

            def conv(x):
                if isinstance(x, torch.Tensor):
                    return globalize(x, place, next(it), rank, case.grad)
                if isinstance(x, (list, tuple)):
                    return type(x)(conv(v) for v in x)
                if isinstance(x, dict):
                    return {k: conv(v) for k, v in x.items()}
                return x
            gargs, gkw = conv(args), conv(kwargs)
            label = f"{name} with input sbps {nds}"
            try:
                got = case.flow_fn(*gargs, **gkw)
                g_outs = leaves(got)
                for o, w in zip(g_outs, w_outs):
                    full = o.to_global(sbp=(B,) * place.ndim).to_local().to_torch()
                    ok = torch.allclose(full.double(), w.to_torch().double(), atol=1e-6, rtol=1e-5, equal_nan=True) \
                        if w.is_floating_point() else torch.equal(full, w.to_torch())
                    if not ok:
                        failures.append(f"{label}: output differs from single-process")
                g_ins = [x for x in leaves((gargs, gkw)) if x.requires_grad]
                if ups and g_ins:
                    gu = [flow.from_torch(u).to_global(place, (B,) * place.ndim) for u in ups]
                    gg = flow.autograd.grad([o for o in g_outs if o.requires_grad], g_ins, gu, allow_unused=True)
                    for i, (a, b) in enumerate(zip(gg, w_grads)):
                        if b is None or a is None:
                            continue
                        full = a.to_global(sbp=(B,) * place.ndim).to_local().to_torch()
                        if not torch.allclose(full.double(), b.to_torch().double(), atol=1e-6, rtol=1e-5):
                            failures.append(f"{label}: grad of input {i} differs")
                if w_second is not None:
                    got = case.flow_fn(*gargs, **gkw)
                    gu = [flow.from_torch(u).to_global(place, (B,) * place.ndim) for u in ups]
                    g2 = _second_order([o for o in leaves(got) if o.requires_grad], g_ins, gu,
                                       torch.Generator().manual_seed(7))
                    for i, (a, b) in enumerate(zip(g2 or (), w_second)):
                        if b is None or a is None:
                            if (a is None) != (b is None):
                                failures.append(f"{label}: second-order grad of input {i} is "
                                                f"{'missing' if a is None else 'extra'}")
                            continue
                        full = a.to_global(sbp=(B,) * place.ndim).to_local().to_torch()
                        if not torch.allclose(full.double(), b.to_torch().double(), atol=1e-6, rtol=1e-5,
                                              equal_nan=True):   # (torch's too: norm at 0)
                            failures.append(f"{label}: second-order grad of input {i} differs")
                checked += 1
            except Exception as e:  # reported, never swallowed
                msg = str(e).splitlines()[0][:300]
                if "mixes a local tensor" in msg:  # the case's function closes over local tensors
                    local_only.append(name)
                    continue
                failures.append(f"{label}: {type(e).__name__}: {msg}")
    return checked, failures, sorted(set(local_only))


def mlp_step(rank: int, mode: str, steps: int, data):
    """Trains a 2-layer MLP ``steps`` SGD steps under a parallel layout; returns losses and the
    final weights gathered. ``mode``: single (no placement), dp, tp (Megatron), 2d (dp x tp)."""
    x_all, y_all, w1, w2 = data
    if mode == "single":
        place = None
    elif mode == "2d":
        place = flow.placement("cpu", [[0, 1], [2, 3]])
    else:
        place = flow.placement("cpu", [0, 1])
    lay = {"dp": dict(x=(S(0),), w1=(B,), w2=(B,)),
           "tp": dict(x=(B,), w1=(S(1),), w2=(S(0),)),
           "2d": dict(x=(S(0), B), w1=(B, S(1)), w2=(B, S(0)))}.get(mode)

    def g(t, key, grad=False):
        t = flow.from_torch(t.clone())
        if place is not None:  # the whole tensor on every rank, then boxed to the layout
            t = t.to_global(place, (B,) * place.ndim).to_global(sbp=lay[key])
        return t.requires_grad_(grad) if grad else t
    p1, p2 = g(w1, "w1", True), g(w2, "w2", True)
    opt = flow.optim.SGD([p1, p2], lr=0.1, momentum=0.9)
    losses = []
    for i in range(steps):
        x, y = g(x_all[i], "x"), g(y_all[i], "x")
        h = flow.relu(x @ p1)
        out = h @ p2
        loss = ((out - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        flow.nn.utils.clip_grad_norm_([p1, p2], 5.0)
        opt.step()
        full = loss.to_global(sbp=(B,) * place.ndim).to_local() if place is not None else loss
        losses.append(full.item())
    def whole(p):
        return (p.to_global(sbp=(B,) * place.ndim).to_local() if place is not None else p).to_torch()
    return losses, whole(p1), whole(p2)


def move_pairs(rank: int, cases, shape):
    """Moves between placements (tests/global/test_moves_and_errors.py): for each
    (src ranks, src nd-SBP, dst ranks, dst nd-SBP), what this rank holds after the move — its
    shard and the whole boxed to broadcast on destination ranks, the empty local tensor elsewhere."""
    gen = torch.Generator().manual_seed(1)
    full = torch.randn(shape, generator=gen, dtype=torch.float64)
    out = []
    for src_ranks, src, dst_ranks, dst in cases:
        sp, dp = flow.placement("cpu", src_ranks), flow.placement("cpu", dst_ranks)
        x = partial_of(full, sp, src, rank) if sp.coords(rank) is not None else \
            make_global(flow.from_torch(full.new_empty((0,))), sp, src, full.shape)
        y = x.to_global(placement=dp, sbp=dst)
        got = {"placement": y.placement, "sbp": tuple(y.sbp), "shape": tuple(y.shape),
               "numel": y._data.numel()}
        if dp.coords(rank) is not None:
            got["local"] = y.to_local().to_torch()
            got["whole"] = y.to_global(sbp=(B,) * dp.ndim).to_local().to_torch()
        else:  # one program on every rank: an empty local tensor outside the placement
            got["outside_local"] = tuple(y.to_local().shape)
        out.append(got)
    return full, out


def check_meta_mismatch(rank: int, ranks):
    """Ranks pass local tensors of different dtypes with check_meta=True: every rank gets the
    same clear error (no hang, no collective left half-done)."""
    place = flow.placement("cpu", ranks)
    local = torch.zeros(2, 3, dtype=torch.float64 if rank == ranks[-1] else torch.float32)
    try:
        flow.from_torch(local).to_global(place, S(0), check_meta=True)
    except flow.HoloflowError as e:
        return str(e)
    return None


def counted_conversions(rank: int) -> list:
    """flow.comm.count() around this rank's boxing of one tensor through every 1-D SBP pair and a
    global matmul's forward and backward: (counts, bytes) per block, as this rank saw them."""
    import holoflow as flow
    from holoflow.sbp import B, P, S
    place = flow.placement("cpu", [0, 1])
    g = torch.Generator().manual_seed(3)
    full = torch.randn(6, 4, generator=g)
    out = []
    for src, dst in ((S(0), B), (B, S(1)), (S(0), S(1)), (P, B), (P, S(0)), (S(1), P)):
        x = flow.from_torch(full).to_global(place, B).to_global(sbp=src)
        with flow.comm.count() as c:
            x.to_global(sbp=dst)
        out.append((dict(c.counts), dict(c.bytes)))
    w = flow.from_torch(torch.randn(4, 3, generator=g)).to_global(place, B).requires_grad_()
    x = flow.from_torch(full).to_global(place, B).to_global(sbp=S(0))
    with flow.comm.count() as c:
        (x @ w).sum().backward()
    out.append((dict(c.counts), dict(c.bytes)))
    return out
