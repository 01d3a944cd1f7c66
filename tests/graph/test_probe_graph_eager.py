"""Differential probes: nn.Graph vs torch eager (holoflow eager as a second reference) on local
models, several steps each: AMP (autocast in build / around the call / config.enable_amp, grad
scaler), gradient accumulation with BatchNorm and dropout, activation checkpointing with dropout,
LR schedulers + clip_grad_norm_ + weight-decay groups + optimizer state round trips, and graph
I/O semantics (in-place writes on inputs, parameters as outputs, eval / requires_grad toggles)."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.graph import Graph

nn = flow.nn


def sync(fm, tm):
    fs, ts = fm.state_dict(), tm.state_dict()
    assert list(fs) == list(ts)
    for k in fs:
        fs[k]._data.copy_(ts[k].detach())


def assert_state(fm, tm, tol=1e-5):
    fs, ts = fm.state_dict(), tm.state_dict()
    for k in fs:
        np.testing.assert_allclose(fs[k]._data.double().numpy(), ts[k].detach().double().numpy(),
                                   atol=tol, rtol=tol, err_msg=k)


def assert_opt_state(fo, to, tol=1e-5):
    fsd, tsd = fo.state_dict(), to.state_dict()
    assert [g["lr"] for g in fsd["param_groups"]] == pytest.approx([g["lr"] for g in tsd["param_groups"]])
    assert set(fsd["state"]) == set(tsd["state"])
    for i, st in tsd["state"].items():
        for k, v in st.items():
            fv = fsd["state"][i][k]
            fv = fv._data if hasattr(fv, "_data") else torch.as_tensor(fv)
            np.testing.assert_allclose(fv.double().numpy(), torch.as_tensor(v).double().numpy(),
                                       atol=tol, rtol=tol, err_msg=f"{i}.{k}")


class Train(Graph):
    def __init__(self, m, opt, sch=None, clip=None):
        super().__init__()
        self.m, self.clip = m, clip
        self.add_optimizer(opt, lr_sch=sch)

    def build(self, x, y):
        loss = flow.nn.functional.cross_entropy(self.m(x), y)
        loss.backward()
        if self.clip is not None:
            flow.nn.utils.clip_grad_norm_(self.m.parameters(), self.clip)
        return loss


def mlp(lib, norm):
    N = lib.nn
    return N.Sequential(N.Linear(4, 8), getattr(N, norm)(8), N.ReLU(), N.Linear(8, 3))


def torch_step(tm, to, x, y, clip=None):
    to.zero_grad()
    loss = torch.nn.functional.cross_entropy(tm(torch.tensor(x)), torch.tensor(y))
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(tm.parameters(), clip)
    to.step()
    return loss.item()


# -- 4. schedulers, clipping, weight-decay groups, optimizer state round trip --------------------

def _groups(m):
    dec = [p for n, p in m.named_parameters() if p.dim() == 2]
    rest = [p for n, p in m.named_parameters() if p.dim() != 2]
    return [{"params": dec, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0, "lr": 0.02}]


def _sched(lib, o):
    S = lib.optim.lr_scheduler
    return S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=2), S.CosineAnnealingLR(o, T_max=5)],
                          milestones=[2])


def test_scheduler_clip_groups_then_eager_resume_matches_torch():
    torch.manual_seed(0)
    tm, fm = mlp(torch, "LayerNorm"), mlp(flow, "LayerNorm")
    sync(fm, tm)
    to, fo = torch.optim.AdamW(_groups(tm), lr=0.05), flow.optim.AdamW(_groups(fm), lr=0.05)
    ts, fs = _sched(torch, to), _sched(flow, fo)
    g = Train(fm, fo, fs, clip=0.5)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = rng.standard_normal((6, 4)).astype("f"), rng.integers(0, 3, 6)
        ref = torch_step(tm, to, x, y, clip=0.5)
        ts.step()
        assert g(flow.tensor(x), flow.tensor(y)).item() == pytest.approx(ref, rel=1e-5)
        assert_state(fm, tm)
        assert_opt_state(fo, to)
    # graph-trained state into a fresh eager optimizer + scheduler; torch does the same round trip
    fo2 = flow.optim.AdamW(_groups(fm), lr=0.05)
    fo2.load_state_dict(fo.state_dict())
    fs2 = _sched(flow, fo2)
    fs2.load_state_dict(fs.state_dict())
    to2 = torch.optim.AdamW(_groups(tm), lr=0.05)
    to2.load_state_dict(to.state_dict())
    ts2 = _sched(torch, to2)
    ts2.load_state_dict(ts.state_dict())
    for _ in range(2):
        x, y = rng.standard_normal((6, 4)).astype("f"), rng.integers(0, 3, 6)
        ref = torch_step(tm, to2, x, y, clip=0.5)
        ts2.step()
        fo2.zero_grad()
        loss = flow.nn.functional.cross_entropy(fm(flow.tensor(x)), flow.tensor(y))
        loss.backward()
        flow.nn.utils.clip_grad_norm_(fm.parameters(), 0.5)
        fo2.step()
        fs2.step()
        assert loss.item() == pytest.approx(ref, rel=1e-5)
        assert_state(fm, tm)
        assert_opt_state(fo2, to2)


# -- 5. train/eval and requires_grad toggled between calls ---------------------------------------

def test_requires_grad_and_eval_toggles_between_calls_retrace_like_eager():
    torch.manual_seed(0)
    tm, fm = mlp(torch, "BatchNorm1d"), mlp(flow, "BatchNorm1d")
    sync(fm, tm)
    to = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    fo = flow.optim.SGD(fm.parameters(), lr=0.1, momentum=0.9)
    g = Train(fm, fo)
    for m in (tm, fm):
        m[0].weight.requires_grad_(False)   # frozen for the first calls
    rng = np.random.default_rng(0)
    for step in range(6):
        if step == 2:    # unfrozen: the graph must now update it (and make its momentum)
            tm[0].weight.requires_grad_(True)
            fm[0].weight.requires_grad_(True)
        if step == 3:    # eval: BatchNorm uses (and keeps) its running statistics
            tm.eval()
            fm.eval()
        if step == 4:
            tm.train()
            fm.train()
        if step == 5:    # frozen again: no update, momentum kept
            tm[3].bias.requires_grad_(False)
            fm[3].bias.requires_grad_(False)
        x, y = rng.standard_normal((8, 4)).astype("f"), rng.integers(0, 3, 8)
        ref = torch_step(tm, to, x, y)
        assert g(flow.tensor(x), flow.tensor(y)).item() == pytest.approx(ref, rel=1e-5)
        assert_state(fm, tm)
        assert_opt_state(fo, to)


# -- 5. graph I/O: in-place writes on inputs, state as outputs, buffers ----------------------------

class _Infer(Graph):
    def __init__(self, m, fn):
        super().__init__()
        self.m, self.fn = m, fn

    def build(self, *a):
        return self.fn(self.m, *a)


def _write_inputs(m, x, z):
    x.add_(1)
    z[0].mul_(0)     # through a view: the base input changes
    return m(x) + z.sum()


def test_in_place_writes_on_graph_inputs_reach_the_caller_as_in_eager():
    m = nn.Linear(3, 2)
    g = _Infer(m, _write_inputs)
    for _ in range(2):
        x, z = flow.ones(2, 3), flow.arange(6.0).reshape(2, 3)
        xe, ze = flow.ones(2, 3), flow.arange(6.0).reshape(2, 3)
        with flow.no_grad():
            out, ref = g(x, z), _write_inputs(m, xe, ze)
        np.testing.assert_array_equal(out.numpy(), ref.numpy())
        np.testing.assert_array_equal(x.numpy(), xe.numpy())
        np.testing.assert_array_equal(z.numpy(), ze.numpy())
    # streamed batches too, each into its own caller tensors
    xs = [flow.full((2, 3), float(i)) for i in range(3)]
    zs = [flow.ones(2, 3) for _ in range(3)]
    list(g.stream(zip(xs, zs)))
    for i in range(3):
        np.testing.assert_array_equal(xs[i].numpy(), np.full((2, 3), i + 1.0))
        np.testing.assert_array_equal(zs[i].numpy(), [[0, 0, 0], [1, 1, 1]])


def test_in_place_write_on_input_under_gradient_accumulation():
    flow.manual_seed(0)
    m = nn.Linear(3, 1)
    opt = flow.optim.SGD(m.parameters(), lr=0.0)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x):
            x.mul_(2)
            loss = self.m(x).sum()
            loss.backward()
            return loss

    x = flow.arange(12.0).reshape(4, 3)
    G()(x)
    np.testing.assert_array_equal(x.numpy(), 2 * np.arange(12.0).reshape(4, 3))


def test_parameter_and_buffer_outputs_like_eager():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.register_buffer("count", flow.zeros(2))

        def forward(self, x):
            self.count.add_(x.sum(0)[:2])
            return self.count * 2

    m = M()

    def fn(m, x):
        return m.fc.weight, m(x), x

    g = _Infer(m, fn)
    for call in range(1, 4):
        x = flow.ones(3, 3)
        w, c2, xo = g(x)
        np.testing.assert_array_equal(w.numpy(), m.fc.weight.detach().numpy())
        np.testing.assert_array_equal(c2.numpy(), np.full(2, 6.0 * call))
        np.testing.assert_array_equal(m.count.numpy(), np.full(2, 3.0 * call))
        np.testing.assert_array_equal(xo.numpy(), x.numpy())


# -- 2. gradient accumulation: BatchNorm per micro-batch, dropout masks per micro-batch ------------

def test_gradient_accumulation_batchnorm_momentum_matches_torch_micro_batches():
    torch.manual_seed(0)
    tm, fm = mlp(torch, "BatchNorm1d"), mlp(flow, "BatchNorm1d")
    sync(fm, tm)
    to = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    fo = flow.optim.SGD(fm.parameters(), lr=0.1, momentum=0.9)
    g = Train(fm, fo)
    g.config.set_gradient_accumulation_steps(3)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = rng.standard_normal((12, 4)).astype("f"), rng.integers(0, 3, 12)
        to.zero_grad()
        refs = []
        for xc, yc in zip(np.split(x, 3), np.split(y, 3)):
            loss = torch.nn.functional.cross_entropy(tm(torch.tensor(xc)), torch.tensor(yc))
            (loss / 3).backward()
            refs.append(loss.item())
        to.step()
        np.testing.assert_allclose(g(flow.tensor(x), flow.tensor(y)).numpy(), refs, rtol=1e-5)
        assert_state(fm, tm)   # running stats chained micro-batch to micro-batch
        assert_opt_state(fo, to)


def test_gradient_accumulation_dropout_masks_per_micro_batch_and_gradient_uses_them():
    flow.manual_seed(0)
    w = nn.Parameter(flow.ones(2000))
    opt = flow.optim.SGD([w], lr=0.25)
    drop = nn.Dropout(0.5)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.d = drop
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(4)

        def build(self, x):
            o = self.d(x * w)
            o.sum().backward()
            return o

    g = G()
    o1 = g(flow.ones(4, 2000)).numpy()
    # the update is -lr * sum_k(mask_k * 2) / 4 = -lr * the mean of the returned rows
    np.testing.assert_allclose(w.detach().numpy(), 1.0 - 0.25 * o1.mean(0), rtol=1e-6)
    w1 = w.detach().numpy().copy()
    o2 = g(flow.ones(4, 2000)).numpy() / w1
    for o in (o1, o2):
        assert set(np.unique(np.round(o, 5))) <= {0.0, 2.0}
        assert 0.45 < (o != 0).mean() < 0.55
        for k in range(1, 4):   # independent masks per micro-batch
            assert 0.4 < (o[0] == o[k]).mean() < 0.6
    assert 0.4 < ((o1 != 0) == (o2 != 0)).mean() < 0.6   # and per call


# -- 3. activation checkpointing with dropout inside the checkpointed module -----------------------

class _Blk(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.d = nn.Dropout(0.5)

    def forward(self, x):
        return flow.nn.functional.gelu(self.d(flow.tanh(self.fc(x)))) * 3


@pytest.mark.parametrize("how", ["attr", "graph_module"])
def test_checkpointed_dropout_recompute_uses_the_forward_mask(how):
    flow.manual_seed(0)
    blk = _Blk()
    opt = flow.optim.SGD(blk.parameters(), lr=1.0)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = blk
            self.add_optimizer(opt)

        def build(self, x):
            out = self.m(x)
            (out * out).sum().backward()
            return out

    g = G()
    if how == "attr":
        g.m.activation_checkpointing = True
    else:
        g.graph_module(blk).activation_checkpointing = True
    w0, b0 = blk.fc.weight.detach().numpy().copy(), blk.fc.bias.detach().numpy().copy()
    x = flow.randn(8, 16)
    out = g(x)
    assert any("recompute" in n.tags for n in g.passes_log[-1].graph.nodes)
    mask = torch.tensor((out.numpy() != 0).astype("f") * 2.0)   # the forward's mask, observed
    W, B = torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    ref = torch.nn.functional.gelu(torch.tanh(torch.tensor(x.numpy()) @ W.T + B) * mask) * 3
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b0 - blk.fc.bias.detach().numpy(), B.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w0 - blk.fc.weight.detach().numpy(), W.grad.numpy(), rtol=1e-4, atol=1e-5)


# -- 1. AMP: the same ops cast as torch.autocast ----------------------------------------------------

def _amp_ops(lib, x, idx, w, w2, emb, ln_w, ln_b, bn_w, bn_b, rm, rv):
    F = lib.nn.functional
    e = F.embedding(idx, emb)
    h = F.linear(e + x, w)
    ln = F.layer_norm(h, (8,), ln_w, ln_b)
    bn = F.batch_norm(h.reshape(-1, 8), rm, rv, bn_w, bn_b, training=True)
    s = F.softmax(ln, -1)
    o = F.linear(s + F.gelu(h), w2)
    ce = F.cross_entropy(o.reshape(-1, 5), idx.reshape(-1) % 5)
    return dict(e=e, h=h, ln=ln, bn=bn, s=s, ls=F.log_softmax(ln, -1), o=o, ce=ce, cat=lib.cat([h, e], -1),
                sum=h.sum(), mm=h @ h.transpose(-1, -2))


def _amp_arrays():
    rng = np.random.default_rng(0)
    f = np.float32
    return [rng.standard_normal((2, 3, 8)).astype(f), rng.integers(0, 10, (2, 3)),
            rng.standard_normal((8, 8)).astype(f), rng.standard_normal((5, 8)).astype(f),
            rng.standard_normal((10, 8)).astype(f), np.ones(8, f), np.zeros(8, f), np.ones(8, f),
            np.zeros(8, f), np.zeros(8, f), np.ones(8, f)]


@pytest.mark.parametrize("mode", ["inside", "around", "config"])
def test_amp_graph_casts_the_same_ops_as_torch_autocast(mode):
    arrs = _amp_arrays()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _amp_ops(torch, *[torch.tensor(a) for a in arrs])

    class G(Graph):
        def build(self, *a):
            if mode == "inside":
                with flow.autocast("cpu", dtype=flow.bfloat16):
                    return _amp_ops(flow, *a)
            return _amp_ops(flow, *a)

    g = G()
    if mode == "config":
        g.config.enable_amp(True)
    ins = [flow.tensor(a) for a in arrs]
    if mode == "around":
        with flow.autocast("cpu", dtype=flow.bfloat16):
            got = g(*ins)
    else:
        got = g(*ins)
    for k, r in ref.items():
        assert got[k]._data.dtype == r.dtype, k
        np.testing.assert_allclose(got[k]._data.double().numpy(), r.detach().double().numpy(), rtol=1e-2,
                                   atol=1e-2, err_msg=k)


class _AmpNet:
    @staticmethod
    def make(lib):
        N, F = lib.nn, lib.nn.functional

        class M(N.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.fc, self.ln = N.Embedding(11, 8), N.Linear(8, 8), N.LayerNorm(8)
                self.bn, self.out = N.BatchNorm1d(8), N.Linear(8, 5)

            def forward(self, idx, y):
                h = self.bn(self.emb(idx).reshape(-1, 8)).reshape(idx.shape + (8,))
                h = self.ln(self.fc(h))
                h = F.softmax(h, -1) + F.gelu(h)
                return F.cross_entropy(self.out(h).reshape(-1, 5), y.reshape(-1))
        return M()


@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("mode", ["inside", "around", "config"])
def test_amp_training_with_grad_scaler_close_to_torch_autocast(mode, scaled):
    torch.manual_seed(0)
    tm, fm = _AmpNet.make(torch), _AmpNet.make(flow)
    sync(fm, tm)
    to, fo = torch.optim.SGD(tm.parameters(), lr=0.1), flow.optim.SGD(fm.parameters(), lr=0.1)
    ts = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2) if scaled else None
    fs = flow.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2) if scaled else None

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = fm
            self.add_optimizer(fo)

        def build(self, i, y):
            if mode == "inside":
                with flow.autocast("cpu", dtype=flow.bfloat16):
                    loss = self.m(i, y)
            else:
                loss = self.m(i, y)
            loss.backward()
            return loss

    g = G()
    if mode == "config":
        g.config.enable_amp(True)
    if scaled:
        g.set_grad_scaler(fs)
    rng = np.random.default_rng(0)
    for _ in range(4):
        i, y = rng.integers(0, 11, (4, 3)), rng.integers(0, 5, (4, 3))
        to.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ref = tm(torch.tensor(i), torch.tensor(y))
        (ts.scale(ref) if scaled else ref).backward()
        if scaled:
            ts.step(to)
            ts.update()
        else:
            to.step()
        if mode == "around":
            with flow.autocast("cpu", dtype=flow.bfloat16):
                loss = g(flow.tensor(i), flow.tensor(y))
        else:
            loss = g(flow.tensor(i), flow.tensor(y))
        assert loss.item() == pytest.approx(ref.item(), abs=5e-3)
        assert_state(fm, tm, tol=2e-2)
    if scaled:
        assert fs.get_scale() == ts.get_scale()


@pytest.mark.parametrize("acc", [1, 2])
def test_in_place_write_on_a_global_input(acc):
    """A global graph writes its split input back as eager would; with gradient accumulation
    (micro-batches as runtime iterations) it refuses, naming the input, instead of dropping it."""
    from holoflow.core.errors import UnsupportedError
    from holoflow.core.sbp import B, S
    from holoflow.distributed import world

    def run(rank):
        P = flow.placement("cpu", [0, 1])
        m = flow.nn.Linear(4, 3).to_global(P, B)
        opt = flow.optim.SGD(m.parameters(), lr=0.1)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)
                if acc > 1:
                    self.config.set_gradient_accumulation_steps(acc)

            def build(self, x):
                x.add_(1)
                loss = self.m(x).sum()
                loss.backward()
                return loss
        x = flow.arange(32.0).reshape(8, 4).to_global(P, B).to_global(sbp=S(0))
        if acc > 1:
            with pytest.raises(UnsupportedError, match=r"writes its input\(s\) \[0\] in place"):
                G()(x)
            return None
        G()(x)
        return x.to_global(sbp=B).to_local().to_torch()
    for got in world.simulate(2, run, timeout=60):
        if acc == 1:
            torch.testing.assert_close(got, torch.arange(32.0).reshape(8, 4) + 1)


@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
def test_enable_amp_casts_composite_losses_like_autocast(loss):
    """Losses written from primitives (mse_loss...) are float32 ops under autocast; under
    config.enable_amp the trace marks their inputs (AMP_BOUNDARY) so the pass casts them as
    torch.autocast does: the loss and its gradients as torch's, the loss in float32."""
    gen = torch.Generator().manual_seed(0)
    w0, x0, y0 = torch.randn(8, 8, generator=gen), torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    tw = w0.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):   # both loss inputs bfloat16
        tl = getattr(torch.nn.functional, loss)(torch.nn.functional.linear(x0, tw),
                                                torch.nn.functional.linear(y0, w0))
    tl.backward()
    fw = flow.nn.Parameter(flow.from_torch(w0.clone()))
    opt = flow.optim.SGD([fw], lr=1.0)   # the step is the gradient

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.add_optimizer(opt)
            self.config.enable_amp(True)

        def build(self, x, y):
            F = flow.nn.functional
            out = getattr(F, loss)(F.linear(x, fw), F.linear(y, flow.from_torch(w0)))
            out.backward()
            return out
    got = G()(flow.from_torch(x0), flow.from_torch(y0))
    assert got.dtype == flow.float32 and tl.dtype == torch.float32
    torch.testing.assert_close(got.to_torch(), tl.detach(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(w0 - fw.detach().to_torch(), tw.grad, rtol=2e-2, atol=2e-2)


def test_an_inference_graph_returns_a_view_of_a_parameter():
    """A graph without an optimizer traces under no_grad; a view of a parameter it returns is read
    after the trace, which is no in-place write to the parameter (the no_grad-view check fired)."""
    m = flow.nn.Linear(4, 3)

    class Infer(Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):
            return self.m(x), self.m.weight.t()
    x = flow.randn(2, 4)
    y, w = Infer()(x)
    np.testing.assert_array_equal(w.numpy(), m.weight.detach().numpy().T)
    np.testing.assert_allclose(y.numpy(), m(x).detach().numpy(), rtol=1e-6)
