"""Each declared SBP signature of an op, checked through its local backward: eager global tensors
run an op's backward on the shards, in the signature its forward chose (a gradient arriving at a
tensor of SBP s has SBP dual(s): S stays S, B <-> P), so a signature whose forward is right can
still give a wrong gradient where the backward reads more than the shard's values (embedding_bag
with scale_grad_by_freq split by bags counted each rank's own indices: 2b8504a). The op tables'
SBP check (tests/harness.py, ``check_sbp``) validates each signature's forward; here, for the ops
a few cases of each table dispatch forward (``dist_fns.op_case_names_per_op``), every signature
the chooser would offer on 3 simulated ranks (uneven, some shards empty) gets shards of random
inputs and upstream gradients laid out as dual(outputs) (random pieces for a partial sum), and
its local backward, combined as dual(inputs), must equal the unsharded backward."""
import importlib
import itertools

import pytest
import torch

import holoflow as flow
from dist_fns import op_case_names_per_op
from harness import F32, F64, _balanced, _inexact, _wide, leaves, rank_call, shard, sig_str, signatures, to_flow
from holoflow.core.dispatch import apply
from holoflow.core.interpret import Observe, pushed
from holoflow.core.sbp import B, P, S

# (module, cases per op): the sampling table's first and last case of each op, the others' first
TABLES = [("ops.test_sampling", 2), ("ops.test_nn_ops", 1), ("ops.test_nn_extra", 1), ("ops.test_indexing", 1),
          ("ops.test_shape", 1)]


def _vjp(op, datas: list, attrs: dict, ups: list) -> list | None:
    """The input gradients of ``op`` on ``datas`` (holoflow, local) for upstream ``ups``."""
    xs = [flow.from_torch(d.clone()).requires_grad_(_inexact(d)) if isinstance(d, torch.Tensor) else d
          for d in datas]
    out = apply(op, *xs, **attrs)
    outs = [out] if isinstance(out, flow.Tensor) else list(out)
    ins = [x for x in xs if isinstance(x, flow.Tensor) and x.requires_grad]
    pairs = [(o, u) for o, u in zip(outs, ups) if isinstance(o, flow.Tensor) and o.requires_grad and u is not None]
    if not ins or not pairs:
        return None
    gs = flow.autograd.grad([o for o, _ in pairs], ins, [flow.from_torch(u) for _, u in pairs], allow_unused=True)
    return [None if g is None else g.to_torch() for g in gs]


def _dual(s):
    return P if s == B else B if s == P else s


def check_backward(op, datas: tuple, attrs: dict, sig, p: int) -> str | None:
    """None if ``sig``'s local backward on ``p`` simulated ranks gives the unsharded gradients."""
    gen = torch.Generator().manual_seed(p + 10)
    ins, outs = sig
    tens = [i for i, d in enumerate(datas) if isinstance(d, torch.Tensor)]
    if any(s == P and not _inexact(datas[i]) for i, s in zip(tens, ins)):
        return None   # (no partial sum of integers is made)
    want = op.kernel(*datas, **attrs)
    wants = [want] if isinstance(want, torch.Tensor) else list(want)
    if not _balanced(op, datas, attrs, sig, p, wants):
        return None   # the chooser never offers it here
    ups = [torch.randn(w.shape, generator=gen, dtype=torch.float64).to(w.dtype)
           if isinstance(w, torch.Tensor) and _inexact(w) else None for w in wants]
    try:
        ref = _vjp(op, list(datas), attrs, ups)
    except Exception:  # noqa: BLE001 - no backward for it unsharded (a fused backward's own): nothing to compare
        return None
    if ref is None:
        return None
    shards = {i: shard(datas[i], s, p, gen) for i, s in zip(tens, ins)}
    up_shards = [None if u is None else shard(u, _dual(s), p, gen) for u, s in zip(ups, outs)]
    per_rank = []
    for r in range(p):
        local, a = rank_call(op, datas, attrs, shards, ins, r)
        try:
            per_rank.append(_vjp(op, local, a, [None if u is None else u[r] for u in up_shards]))
        except Exception as e:  # noqa: BLE001 - a legal signature's backward must run on every shard
            return f"rank {r}'s backward failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    grad_ins = [(i, s) for i, s in zip(tens, ins) if _inexact(datas[i])]
    for k, (i, s) in enumerate(grad_ins):
        w = ref[k]
        if w is None or not torch.isfinite(_wide(w)).all():
            continue   # (a non-finite gradient: pieces of a sum need not add up to it bit for bit)
        gs = [None if pr is None else pr[k] for pr in per_rank]
        gs = [torch.zeros_like(shards[i][r]) if g is None else g for r, g in enumerate(gs)]
        if isinstance(s, S):
            got = torch.cat(gs, dim=s.axis)
        elif s == B:   # its gradient is a partial sum
            got = sum(gs[1:], gs[0])
        else:          # a partial input's gradient is broadcast: every rank the whole
            if not all(torch.allclose(_wide(g), _wide(gs[0]), atol=1e-6) for g in gs[1:]):
                return f"the gradient of partial input {i} differs across ranks"
            got = gs[0]
        if got.shape != w.shape or not torch.allclose(_wide(got), _wide(w), atol=1e-6, rtol=1e-5):
            return f"the gradient of input {i} differs from the unsharded one"
    return None


def forward_ops(case) -> list[tuple]:
    """Every (op, torch inputs, attrs) the case's forward dispatches (its backward's grad ops run
    on shards in eager, never through a signature of their own)."""
    calls = []

    def pre(op, inputs, attrs):
        calls.append((op, tuple(x._data.detach().clone() if isinstance(x, flow.Tensor) else x for x in inputs),
                      dict(attrs)))
        return inputs
    args, kwargs = case.make(next((d for d in (F64, F32) if d in case.dtypes), case.dtypes[0]),
                             torch.Generator().manual_seed(0))
    with pushed(Observe(pre)):
        leaves(case.flow_fn(*to_flow(args, case.grad), **to_flow(kwargs, case.grad)))
    return calls


def _cases():
    for module, per_op in TABLES:
        cases = {c.name: c for c in importlib.import_module(module).CASES}
        for name in op_case_names_per_op(module, per_op):
            c = cases[name]
            if c.grad and c.sbp and not c.random:
                yield pytest.param(c, id=f"{module.split('.')[-1]}:{name}")


@pytest.mark.parametrize("case", list(_cases()))
def test_every_signature_backward_on_shards_matches_the_unsharded_one(case):
    failures = []
    for op, datas, attrs in forward_ops(case):
        if op.grad is None or op.random or op.sbp is None:
            continue
        for sig, p in itertools.product(signatures(op, datas, attrs), (3,)):
            why = check_backward(op, datas, attrs, sig, p)
            if why:
                failures.append(f"{op.name} {sig_str(sig)} on {p} ranks: {why}")
    assert not failures, f"{case.name}:\n" + "\n".join(failures)


def test_unreduce_offers_no_split_of_a_reduced_axis_kept_as_size_one():
    """A sum over a dim of size 1 kept as 1 (keepdim) has its gradient broadcast back by unreduce;
    its rule offered S on that axis (input and output both of size 1), and on the rank whose
    shard of it is empty the backward (a sum keeping the dim) gave size 1 for 0: a loud shape
    mismatch in a double backward of a traced global graph."""
    from holoflow.ops.reduction import UNREDUCE
    dy = torch.randn(3, 1, 4, dtype=F64)
    attrs = dict(shape=(3, 1, 4), dim=(1,), keepdim=True)
    offered = signatures(UNREDUCE, (dy,), attrs)
    assert ((S(1),), (S(1),)) not in offered and ((S(0),), (S(0),)) in offered
    failures = [f"{sig_str(sig)}: {why}" for sig in offered if (why := check_backward(UNREDUCE, (dy,), attrs, sig, 3))]
    assert not failures, failures
