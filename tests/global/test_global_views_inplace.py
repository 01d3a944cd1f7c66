"""In-place writes through views of global tensors, as torch's views behave: the write reaches the
base (and the base's gradient history), and a view taken before the base changed sees the change —
whether the view aliases the rank's shard (``x[:, 1]`` of a row-split tensor) or the view needed
boxing and is a copy standing for it (``x[:, 1]`` of a column-split one: core/views.py ``CopyOf``).
Every case against torch, values and the leaf's gradient, under every 1-D SBP and on a 2x2 mesh."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, P, S

# (name, write through a view of x); each returns nothing, x is the written base
WRITES = {
    "col_add_": lambda x: x[:, 1].add_(1),
    "row_mul_": lambda x: x[1].mul_(3),
    "rows_fill_": lambda x: x[1:4].fill_(-2),
    "t_row_fill_": lambda x: x.t()[2].fill_(7),
    "col_setitem": lambda x: x[:, 3].__setitem__(slice(1, 3), 5.0),
    "view_of_view": lambda x: x[:, 1:4][2:].mul_(-1),
    "flat_slice": lambda x: x.reshape(-1)[3:9].add_(10),
    "split_piece": lambda x: x.split(2, dim=1)[1].mul_(2),
    "narrow_copy_": lambda x: x.narrow(1, 2, 3).copy_(x[:, :3] * 0.5),
    "diag_add_": lambda x: x.diagonal().add_(100),
    "twice": lambda x: (x[:, 1].add_(1), x[2].mul_(2), x[:, 1].mul_(3)),
}
NO_GRAD_ONLY = {"split_piece"}   # torch refuses in-place writes to one of several views under autograd
SHAPE = (5, 6)
W = np.arange(30.0, dtype=np.float32).reshape(SHAPE) / 7


def _torch_ref(name: str):
    w = torch.tensor(W, requires_grad=name not in NO_GRAD_ONLY)
    x = w * 1.0
    WRITES[name](x)
    if name in NO_GRAD_ONLY:
        return x.numpy(), None
    (x * x).sum().backward()
    return x.detach().numpy(), w.grad.numpy()


def _run(rank: int, ranks, nds) -> dict:
    place = flow.placement("cpu", ranks)
    out = {}
    for nd in nds:
        for name, write in WRITES.items():
            w = flow.tensor(W).to_global(placement=place, sbp=[B] * place.ndim).to_global(sbp=nd)
            w = w.detach().requires_grad_(name not in NO_GRAD_ONLY)
            x = w * 1.0
            write(x)
            if name not in NO_GRAD_ONLY:
                (x * x).sum().backward()
            with flow.no_grad():
                y = w.detach() * 1.0
                write(y)
            whole = [B] * place.ndim
            out[(name, nd)] = (x.detach().to_global(sbp=whole).to_local().numpy(),
                               None if w.grad is None else w.grad.to_global(sbp=whole).to_local().numpy(),
                               y.to_global(sbp=whole).to_local().numpy())
    return out


def _check(results: list) -> None:
    for res in results:
        for (name, nd), (x, grad, y) in res.items():
            want_x, want_grad = _torch_ref(name)
            np.testing.assert_allclose(x, want_x, rtol=1e-6, err_msg=f"{name} {nd}: base value")
            np.testing.assert_allclose(y, want_x, rtol=1e-6, err_msg=f"{name} {nd}: base value, no_grad")
            assert (grad is None) == (want_grad is None), f"{name} {nd}"
            if want_grad is not None:
                np.testing.assert_allclose(grad, want_grad, rtol=1e-5, err_msg=f"{name} {nd}: the leaf's gradient")


def test_writes_through_views_on_2_simulated_ranks():
    _check(world.simulate(2, lambda r: _run(r, [0, 1], [(B,), (S(0),), (S(1),), (P,)])))


def test_writes_through_views_on_a_simulated_2x2_mesh():
    _check(world.simulate(4, lambda r: _run(r, [[0, 1], [2, 3]], [(S(0), S(1)), (S(1), B), (B, S(0))])))


def test_writes_through_views_on_gloo(world2):
    _check(world2.run(_run, [0, 1], [(S(1),), (S(0),)]))


def _reads(rank: int) -> list:
    """Views taken before the base (or another view) changes see the change, as torch's do."""
    place = flow.placement("cpu", [0, 1])
    x = flow.tensor(W).to_global(placement=place, sbp=B).to_global(sbp=S(1))
    col = x[:, 1]          # a copy standing for the view (the column lives on one rank)
    row = x[2]             # crosses the split too
    sub = col[1:3]         # a view of that copy
    x.add_(1)
    first = [col.to_global(sbp=B).to_local().numpy(), (row * 1).to_global(sbp=B).to_local().numpy(),
             sub.to_global(sbp=B).to_local().numpy()]
    row.fill_(0)           # written through one view: the base and the other view see it
    return first + [x.to_global(sbp=B).to_local().numpy(), col.to_global(sbp=B).to_local().numpy()]


def test_views_see_later_writes_to_their_base():
    t = torch.tensor(W)
    col, row, sub = t[:, 1], t[2], t[:, 1][1:3]
    t.add_(1)
    want = [col.clone(), row.clone(), sub.clone()]
    row.fill_(0)
    want += [t.clone(), col.clone()]
    for got in world.simulate(2, _reads):
        for g, w_ in zip(got, want):
            np.testing.assert_allclose(g, w_.numpy(), rtol=1e-6)


@pytest.mark.parametrize("nd", [(S(0),), (S(1),)], ids=["S0", "S1"])
def test_a_leafs_view_still_refuses_in_place_writes_under_autograd(nd):
    def run(rank):
        w = flow.tensor(W).to_global(placement=flow.placement("cpu", [0, 1]), sbp=B).to_global(sbp=nd)
        w = w.detach().requires_grad_(True)
        with pytest.raises(RuntimeError, match="view of a leaf tensor that requires grad"):
            w[:, 1].add_(1)
        return True
    assert all(world.simulate(2, run))


def _graph_run(rank: int, nds) -> dict:
    """The writes inside nn.Graph: the traced value, and one SGD step (lr 1) on the leaf through
    the writes' gradient."""
    place = flow.placement("cpu", [0, 1])
    out = {}
    for nd in nds:
        for name, write in WRITES.items():
            class Infer(flow.nn.Graph):
                def build(self, w):
                    x = w * 1.0
                    write(x)
                    return x
            w = flow.tensor(W).to_global(placement=place, sbp=B).to_global(sbp=nd)
            value = Infer()(w).to_global(sbp=B).to_local().numpy()
            stepped = None
            if name not in NO_GRAD_ONLY:
                m = flow.nn.Module()
                m.w = flow.nn.Parameter(w.detach().clone())
                opt = flow.optim.SGD(m.parameters(), lr=1.0)

                class Train(flow.nn.Graph):
                    def __init__(self):
                        super().__init__()
                        self.m = m
                        self.add_optimizer(opt)

                    def build(self):
                        x = self.m.w * 1.0
                        write(x)
                        loss = (x * x).sum()
                        loss.backward()
                        return loss
                Train()()
                stepped = m.w.detach().to_global(sbp=B).to_local().numpy()
            out[(name, nd)] = value, stepped
    return out


def test_graph_writes_through_views_equal_torch():
    for res in world.simulate(2, lambda r: _graph_run(r, [(B,), (S(0),), (S(1),)])):
        for (name, nd), (value, stepped) in res.items():
            want_x, want_grad = _torch_ref(name)
            np.testing.assert_allclose(value, want_x, rtol=1e-6, err_msg=f"{name} {nd}: graph value")
            if want_grad is not None:
                np.testing.assert_allclose(stepped, W - want_grad, rtol=1e-5, atol=1e-5,
                                           err_msg=f"{name} {nd}: graph step")


VIEW_PROGRAMS = {   # .view() of views of a global tensor: allowed or refused as torch decides
    "chunk-cols-flat": lambda x: x.chunk(2, 1)[1].view(-1),
    "chunk-rows-flat": lambda x: x.chunk(2, 0)[1].view(-1),
    "transposed-flat": lambda x: x.t().view(-1),
    "sliced-split-rows": lambda x: x[:, 1:].view(2, 2, 5),
    "sliced-flat": lambda x: x[:, 1:].view(-1),
}


@pytest.mark.parametrize("name", list(VIEW_PROGRAMS))
@pytest.mark.parametrize("sbp", [S(0), S(1), B], ids=str)
def test_view_of_a_global_view_follows_torchs_strides(name, sbp):
    from holoflow.distributed.global_tensor import from_full
    full = torch.arange(24.).reshape(4, 6)
    fn = VIEW_PROGRAMS[name]
    try:
        want = fn(full.clone())
    except RuntimeError:
        want = None

    def run(r):
        try:
            got = fn(from_full(full.clone(), flow.placement("cpu", [0, 1]), sbp))
        except RuntimeError as e:
            assert "not contiguous enough" in str(e) and "reshape" in str(e)
            return None
        return got.to_global(sbp=B).to_local().to_torch()
    for got in world.simulate(2, run):
        if want is None:
            assert got is None, f"{name}: torch refuses this view; holoflow gave {got}"
        else:
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", ["placement", "device_mesh"])
def test_ranks_holding_one_column_or_none_decide_views_as_the_others(kind):
    """5 columns over 4 ranks (OneFlow's 2,1,1,1) or 6 over torch's DeviceMesh (2,2,2,0): a shard
    of one column or none has strides that say nothing of its layout. ``x.t() * 0.5`` is
    column-major in torch, its reshape a copy (a write stays there); ``x * 0.5`` row-major, its
    reshape a view (a write reaches it). The ranks holding less took the copy for a view, wrote
    back and issued a collective their peers did not (a CommError)."""
    from holoflow.distributed.device_mesh import DeviceMesh
    cols = 5 if kind == "placement" else 6
    full = torch.arange(4.0 * cols).reshape(4, cols)

    def f(r):
        place = flow.placement("cpu", [0, 1, 2, 3]) if kind == "placement" else DeviceMesh("cpu", [0, 1, 2, 3])
        x = flow.tensor(full.numpy()).to_global(place, B).to_global(sbp=S(1))
        out = []
        for y in (x.t() * 0.5, x * 0.5, (x.t() * 0.5).exp().t()):
            z = y.reshape(-1)
            z.masked_fill_(z > 3, -1.0)
            out.append((y.to_global(sbp=B).to_local().tolist(), z.to_global(sbp=B).to_local().tolist()))
        return out, x.to_local().shape[1]
    want = []
    for y in (full.t() * 0.5, full * 0.5, (full.t() * 0.5).exp().t()):
        z = y.reshape(-1)
        z.masked_fill_(z > 3, -1.0)
        want.append((y.tolist(), z.tolist()))
    for r, (got, width) in enumerate(world.simulate(4, f, timeout=60)):
        assert width == ((2, 1, 1, 1) if kind == "placement" else (2, 2, 2, 0))[r]
        for (gy, gz), (wy, wz) in zip(got, want):
            np.testing.assert_allclose(gy, wy, rtol=1e-6, err_msg=f"rank {r}")
            np.testing.assert_allclose(gz, wz, rtol=1e-6, err_msg=f"rank {r}")
