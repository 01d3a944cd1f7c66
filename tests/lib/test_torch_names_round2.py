"""torch names scripts touch (round 2): the submodules ``random``, ``compiler``, ``cpu``,
``profiler`` and ``functional``; the process-wide switches and aliases (``GradScaler``,
``get_device_module``, ``default_generator``, ``set_default_tensor_type`` ...); the deprecated
``range``; the in-place top-level functions; and Tensor's storage and layout methods — each
against torch's behaviour, also through ``mock_torch``."""
import json
import os
import warnings

import pytest
import torch

import holoflow as flow
from holoflow import mock_torch
from holoflow.core.errors import UnsupportedError


def _run(src, **names):
    g = {"__name__": "user_script", **names}
    with mock_torch.enable():
        exec(compile(src, "<script>", "exec"), g)
    return g


# -- torch.random ----------------------------------------------------------------------------------

def test_random_seeding_matches_torch_draws():
    flow.random.manual_seed(123)
    got = flow.randn(5).to_torch()
    torch.random.manual_seed(123)
    want = torch.randn(5)
    torch.testing.assert_close(got, want)
    assert flow.random.initial_seed() == torch.random.initial_seed() == 123
    state = flow.random.get_rng_state()
    assert isinstance(state, flow.Tensor) and state.dtype == flow.uint8
    torch.testing.assert_close(state.to_torch(), torch.random.get_rng_state())
    a = flow.rand(3).to_torch()
    flow.random.set_rng_state(state)
    torch.testing.assert_close(flow.rand(3).to_torch(), a)
    s = flow.random.seed()
    assert s == torch.initial_seed()


def test_fork_rng_restores_the_state_torch_restores():
    flow.manual_seed(5)
    with flow.random.fork_rng():
        inside = flow.randn(4).to_torch()
    after = flow.randn(4).to_torch()
    torch.manual_seed(5)
    with torch.random.fork_rng():
        t_inside = torch.randn(4)
    t_after = torch.randn(4)
    torch.testing.assert_close(inside, t_inside)
    torch.testing.assert_close(after, t_after)
    torch.testing.assert_close(inside, after)   # the fork's draws did not advance the outer stream
    flow.manual_seed(5)
    with flow.random.fork_rng(enabled=False):
        flow.randn(4)
    assert not torch.equal(flow.randn(4).to_torch(), after)


def test_fork_rng_with_absent_devices_raises_torchs_class():
    bad = [torch.cuda.device_count() + 3]
    with pytest.raises(Exception) as t_err:
        with torch.random.fork_rng(devices=bad):
            pass
    with pytest.raises(type(t_err.value), match="holoflow"):
        with flow.random.fork_rng(devices=bad):
            pass
    with flow.random.fork_rng(device_type="meta"), torch.random.fork_rng(device_type="meta"):
        pass


def test_default_generator_is_torchs():
    g = flow.default_generator
    assert g is flow.random.default_generator and g.torch is torch.default_generator
    g.manual_seed(9)
    assert torch.initial_seed() == 9
    x = flow.randn(3, generator=g).to_torch()
    torch.manual_seed(9)
    torch.testing.assert_close(x, torch.randn(3))


# -- torch.compiler --------------------------------------------------------------------------------

def test_compiler_switches_are_pass_throughs():
    assert flow.compiler.is_compiling() is torch.compiler.is_compiling() is False
    assert flow.compiler.is_dynamo_compiling() is False and flow.compiler.is_exporting() is False

    def f(x):
        return x * 2
    assert flow.compiler.disable(f) is f and flow.compiler.disable()(f) is f
    assert flow.compiler.disable(recursive=False)(f) is f
    assert flow.compiler.allow_in_graph(f) is f and flow.compiler.assume_constant_result(f) is f
    m = flow.nn.Linear(2, 2)
    cm, cf = flow.compiler.compile(m, backend="eager"), flow.compiler.compile(backend="eager")(f)
    assert cm._orig_mod is m and isinstance(cm, flow.nn.Module) and cf._orig_mod is f and cf.__name__ == "f"
    assert flow.compiler.compile(m, disable=True) is m
    assert flow.compiler.reset() is None and flow.compiler.cudagraph_mark_step_begin() is None
    assert flow.compiler.list_backends() == ["inductor"]
    assert flow.compiler.list_backends(exclude_tags=None) == ["aot_eager", "eager", "inductor"]
    with pytest.raises(TypeError, match="holoflow"):
        flow.compiler.compile(3)


def test_compiler_under_mock_torch():
    g = _run("""
import torch
@torch.compiler.disable
def step(x):
    return x + 1
flag = torch.compiler.is_compiling()
y = step(torch.ones(2))
""")
    assert g["flag"] is False and g["y"].tolist() == [2.0, 2.0]


# -- torch.cpu -------------------------------------------------------------------------------------

def test_cpu_module_is_torchs_queries():
    assert flow.cpu.is_available() is torch.cpu.is_available() is True
    assert flow.cpu.device_count() == torch.cpu.device_count() == 1
    assert flow.cpu.current_device() == torch.cpu.current_device()
    flow.cpu.synchronize()
    assert isinstance(flow.cpu.current_stream(), torch.cpu.Stream)
    with flow.cpu.stream(flow.cpu.Stream()):
        pass


def test_cpu_amp_autocast_is_holoflow_autocast_on_cpu():
    lin = flow.nn.Linear(4, 3)
    x = flow.randn(2, 4)
    with flow.cpu.amp.autocast():
        y = lin(x)
        assert flow.is_autocast_enabled("cpu")
    assert y.dtype == flow.bfloat16
    tlin = torch.nn.Linear(4, 3)
    tlin.load_state_dict({k: v.to_torch() for k, v in lin.state_dict().items()})
    with torch.autocast("cpu"):
        ty = tlin(x.to_torch())
    torch.testing.assert_close(y.to_torch(), ty)
    with flow.cpu.amp.autocast(enabled=False):
        assert lin(x).dtype == flow.float32
    scaler = flow.cpu.amp.GradScaler(init_scale=8.0)
    assert isinstance(scaler, flow.amp.GradScaler) and scaler.get_scale() == 8.0


# -- torch.profiler --------------------------------------------------------------------------------

def _train_step(model, x):
    with flow.profiler.record_function("forward"):
        loss = model(x).relu().sum()
    loss.backward()


def test_profiler_records_ops_ranges_and_makes_a_table():
    model, x = flow.nn.Linear(4, 3), flow.randn(2, 4)
    with flow.profiler.profile(activities=[flow.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        _train_step(model, x)
    avgs = {a.key: a for a in prof.key_averages()}
    assert {"linear", "relu", "sum", "forward", "linear_backward"} <= set(avgs)
    assert avgs["forward"].count == 1 and avgs["linear"].count == 1
    # a range's total covers the ops inside it; its self time excludes them
    fwd = avgs["forward"]
    inner = sum(avgs[k].cpu_time_total for k in ("linear", "relu", "sum"))
    assert fwd.cpu_time_total >= inner and fwd.self_cpu_time_total <= fwd.cpu_time_total - inner + 1e-6
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=3)
    lines = table.splitlines()
    assert "Name" in lines[1] and "# of Calls" in lines[1] and "Self CPU time total" in table
    rows = [ln.split()[0] for ln in lines[3:] if ln and ln.split()[0] in avgs]
    by_total = sorted(avgs.values(), key=lambda a: a.cpu_time_total, reverse=True)
    assert rows == [a.key for a in by_total[:3]]    # the largest totals first, row_limit rows
    assert "cuda" not in table.lower().replace("device (cuda) times are not measured", "")
    assert prof.key_averages().table(sort_by="cuda_time_total")   # device keys sort by host total
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert ((2, 4), (3, 4), (3,)) in [a.input_shapes for a in by_shape if a.key == "linear"]
    with pytest.raises(AttributeError, match="holoflow"):
        prof.key_averages().table(sort_by="bogus")


def test_profiler_outside_records_nothing_and_record_function_decorates():
    @flow.profiler.record_function("helper")
    def helper(t):
        return t * 2
    assert helper(flow.ones(2)).tolist() == [2.0, 2.0]   # no profiler: just runs
    with flow.profiler.profile() as prof:
        helper(flow.ones(2))
    keys = [e.key for e in prof.events()]
    assert keys.count("helper") == 1 and "mul" in keys
    flow.ones(2) * 3    # after the profile: not recorded
    assert [e.key for e in prof.events()] == keys


def test_profiler_schedule_matches_torch_and_drives_trace_handler(tmp_path):
    kw = dict(wait=1, warmup=1, active=2, repeat=2, skip_first=1)
    ours, theirs = flow.profiler.schedule(**kw), torch.profiler.schedule(**kw)
    assert [ours(i) for i in range(14)] == [theirs(i) for i in range(14)]
    ours, theirs = flow.profiler.schedule(wait=2, warmup=0, active=1, skip_first_wait=1), \
        torch.profiler.schedule(wait=2, warmup=0, active=1, skip_first_wait=1)
    assert [ours(i) for i in range(8)] == [theirs(i) for i in range(8)]
    traces = []
    model, x = flow.nn.Linear(4, 3), flow.randn(2, 4)
    handler = flow.profiler.tensorboard_trace_handler(str(tmp_path), worker_name="w0")
    with flow.profiler.profile(schedule=flow.profiler.schedule(wait=1, warmup=1, active=2),
                               on_trace_ready=lambda p: (traces.append([e.key for e in p.events()]), handler(p))) as prof:
        for _ in range(8):
            _train_step(model, x)
            prof.step()
    assert len(traces) == 2   # steps 2-3 and 6-7 recorded
    assert all(t.count("forward") == 2 for t in traces)
    assert [e.key for e in prof.events()] == traces[-1]   # the last trace stays readable, as torch's
    assert flow.profiler.supported_activities() == {flow.profiler.ProfilerActivity.CPU}
    assert flow.profiler.kineto_available() is False
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and all(f.startswith("w0.") and f.endswith(".pt.trace.json") for f in files)
    data = json.load(open(tmp_path / files[0]))
    assert {"linear", "forward"} <= {e["name"] for e in data["traceEvents"]}
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in data["traceEvents"])


@pytest.mark.parametrize("use_gzip", [False, True])
def test_trace_handler_keeps_two_traces_of_one_millisecond(tmp_path, monkeypatch, use_gzip):
    # torch names a trace by the millisecond it is written in; two within one millisecond must
    # not overwrite each other (the clock is frozen so the collision is certain, not a race)
    import holoflow.profiler as profiler_module
    monkeypatch.setattr(profiler_module.time, "time_ns", lambda: 1_700_000_000_123_456_789)
    handler = flow.profiler.tensorboard_trace_handler(str(tmp_path), worker_name="w", use_gzip=use_gzip)
    for n in (1, 2):
        with flow.profiler.profile() as prof:
            for _ in range(n):
                flow.ones(2).add(1)
        handler(prof)
    suffix = ".pt.trace.json.gz" if use_gzip else ".pt.trace.json"
    assert sorted(os.listdir(tmp_path)) == [f"w.1700000000123{suffix}", f"w.1700000000124{suffix}"]


def test_profiler_under_mock_torch():
    g = _run("""
import torch
from torch.profiler import profile, record_function, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    with record_function("model_inference"):
        y = torch.ones(3) + 1
table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=10)
""")
    assert "model_inference" in g["table"] and "add" in g["table"]


def test_autograd_profiler_shares_the_machinery():
    model, x = flow.nn.Linear(4, 3), flow.randn(2, 4)
    with flow.autograd.profiler.profile(record_shapes=True) as prof:
        with flow.autograd.profiler.record_function("step"):
            model(x).sum().backward()
    keys = {a.key for a in prof.key_averages()}
    assert {"step", "linear", "sum", "linear_backward"} <= keys
    assert "step" in prof.table(sort_by="self_cpu_time_total")
    with flow.autograd.profiler.profile(enabled=False) as off:
        model(x)
    assert list(off.events()) == []
    # one record_function feeds both kinds of profiler
    assert flow.profiler.record_function is flow.autograd.profiler.record_function
    g = _run("""
import torch
with torch.autograd.profiler.profile() as prof:
    with torch.autograd.profiler.record_function("block"):
        torch.ones(2).mul(3)
names = [e.key for e in prof.key_averages()]
""")
    assert "block" in g["names"] and "mul" in g["names"]


# -- torch.functional ------------------------------------------------------------------------------

def test_functional_exports_torchs_names():
    assert set(flow.functional.__all__) == set(torch.functional.__all__)
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    torch.testing.assert_close(flow.functional.einsum("ij,jk->ik", flow.from_torch(a), flow.from_torch(b)).to_torch(),
                               torch.functional.einsum("ij,jk->ik", a, b))
    parts = flow.functional.split(flow.from_torch(a), 1, 1)
    assert [tuple(p.shape) for p in parts] == [tuple(p.shape) for p in torch.functional.split(a, 1, 1)]
    g = _run("import torch\nfrom torch.functional import einsum, norm\n"
             "v = norm(einsum('i,i->i', torch.ones(3), torch.ones(3))).item()")
    assert g["v"] == pytest.approx(3 ** 0.5)


# -- torch.signal.windows ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,kw", [("bartlett", {}), ("blackman", {"sym": False}), ("cosine", {}),
                                     ("exponential", {"tau": 2.0}), ("gaussian", {"std": 0.7}),
                                     ("general_cosine", {"a": [0.5, 0.3, 0.2]}), ("general_hamming", {"alpha": 0.6}),
                                     ("hamming", {"dtype": "float64"}), ("hann", {}), ("kaiser", {"beta": 8.0}),
                                     ("nuttall", {"sym": False})])
def test_signal_windows_match_torch(name, kw):
    assert set(flow.signal.windows.__all__) == set(torch.signal.windows.__all__)
    fkw = {k: (getattr(flow, v) if k == "dtype" else v) for k, v in kw.items()}
    tkw = {k: (getattr(torch, v) if k == "dtype" else v) for k, v in kw.items()}
    got = getattr(flow.signal.windows, name)(7, **fkw)
    want = getattr(torch.signal.windows, name)(7, **tkw)
    assert isinstance(got, flow.Tensor) and got.dtype == flow.from_torch(want).dtype
    torch.testing.assert_close(got.to_torch(), want)
    with pytest.raises(ValueError, match="holoflow"):
        getattr(flow.signal.windows, name)(-1, **fkw)
    g = _run(f"import torch\nw = torch.signal.windows.{name}(4, **kw)", kw=tkw)
    torch.testing.assert_close(g["w"].to_torch(), getattr(torch.signal.windows, name)(4, **tkw))


# -- torch.return_types ----------------------------------------------------------------------------

def _return_type_probes(L):
    g = torch.Generator().manual_seed(0)
    x = L.from_torch(torch.randn(4, 4, generator=g, dtype=torch.float64)) if L is flow else \
        torch.randn(4, 4, generator=g, dtype=torch.float64)
    s = x @ x.T + 4 * L.eye(4, dtype=x.dtype)
    v = x.reshape(-1)
    lu = L.linalg.lu_factor(s)
    return {
        "aminmax": lambda: L.aminmax(x), "cummax": lambda: L.cummax(x, 0), "cummin": lambda: L.cummin(x, 0),
        "frexp": lambda: L.frexp(x), "geqrf": lambda: L.geqrf(s), "histogram": lambda: L.histogram(v, 3),
        "histogramdd": lambda: L.histogramdd(x[:, :2], [2, 2]), "kthvalue": lambda: L.kthvalue(x, 2, 0),
        "linalg_cholesky_ex": lambda: L.linalg.cholesky_ex(s), "linalg_eig": lambda: L.linalg.eig(s),
        "linalg_eigh": lambda: L.linalg.eigh(s), "linalg_inv_ex": lambda: L.linalg.inv_ex(s),
        "linalg_ldl_factor": lambda: L.linalg.ldl_factor(s), "linalg_ldl_factor_ex": lambda: L.linalg.ldl_factor_ex(s),
        "linalg_lstsq": lambda: L.linalg.lstsq(s, x), "linalg_lu": lambda: L.linalg.lu(s),
        "linalg_lu_factor": lambda: L.linalg.lu_factor(s), "linalg_lu_factor_ex": lambda: L.linalg.lu_factor_ex(s),
        "linalg_qr": lambda: L.linalg.qr(s), "linalg_slogdet": lambda: L.linalg.slogdet(s),
        "linalg_solve_ex": lambda: L.linalg.solve_ex(s, x), "linalg_svd": lambda: L.linalg.svd(s),
        "lu_unpack": lambda: L.lu_unpack(*lu), "max": lambda: L.max(x, 0), "median": lambda: x.median(0),
        "min": lambda: x.min(1), "mode": lambda: L.mode(x, 0), "nanmedian": lambda: L.nanmedian(x, 0),
        "qr": lambda: L.qr(s), "slogdet": lambda: L.slogdet(s), "sort": lambda: x.sort(), "svd": lambda: L.svd(s),
        "topk": lambda: L.topk(x, 2), "triangular_solve": lambda: L.triangular_solve(x, s),
    }


def test_return_types_are_the_classes_holoflow_returns_with_torchs_fields():
    ours, theirs = _return_type_probes(flow), _return_type_probes(torch)
    assert set(ours) == set(flow.return_types.__all__)
    assert set(flow.return_types.__all__) <= {n for n in dir(torch.return_types) if not n.startswith("_")}
    for name, call in ours.items():
        got, want = call(), theirs[name]()
        cls = getattr(flow.return_types, name)
        assert isinstance(got, cls), name
        assert isinstance(want, getattr(torch.return_types, name)), name
        assert len(cls._fields) == type(want).n_fields, name
        for field in cls._fields:   # torch's field names, holding torch's values
            g, w = getattr(got, field), getattr(want, field)
            if name == "linalg_eig" or isinstance(w, (list, tuple)):
                continue   # eigenvectors' phases / lists of edges: compared in their own op tests
            torch.testing.assert_close(g.to_torch(), w, msg=f"{name}.{field}")
    assert flow.return_types.all_return_types == [getattr(flow.return_types, n) for n in flow.return_types.__all__]
    g = _run("import torch\nr = torch.max(torch.ones(2, 3), 1)\nok = isinstance(r, torch.return_types.max)")
    assert g["ok"] is True


# -- top-level switches and aliases ----------------------------------------------------------------

def test_grad_scaler_and_device_module():
    assert flow.GradScaler is flow.amp.GradScaler
    s = flow.GradScaler("cpu", init_scale=4.0)
    assert s.scale(flow.ones(1)).item() == 4.0
    want = torch.get_device_module()
    assert flow.get_device_module().__name__ == want.__name__.replace("torch", "holoflow")
    assert flow.get_device_module("cpu") is flow.cpu and flow.get_device_module(torch.device("cuda")) is flow.cuda
    assert flow.get_device_module("cuda:0") is flow.cuda
    for kind in ("mps", "xpu", "mtia"):
        mod = flow.get_device_module(kind)
        assert mod is getattr(flow, kind) and mod.is_available() == torch.get_device_module(kind).is_available()
    for bad in ("foo", "meta"):
        err = None
        try:
            torch.get_device_module(bad)
        except Exception as e:   # noqa: BLE001 - the class is compared
            err = e
        if err is None:
            with pytest.raises(RuntimeError, match="holoflow"):
                flow.get_device_module(bad)
        else:
            with pytest.raises(type(err), match="holoflow"):
                flow.get_device_module(bad)


def test_set_default_tensor_type_sets_torchs_default_dtype():
    try:
        with pytest.warns(UserWarning, match="deprecated"):
            flow.set_default_tensor_type("torch.DoubleTensor")
        assert flow.get_default_dtype() is flow.float64 and flow.ones(1).dtype is flow.float64
        flow.set_default_tensor_type(flow.FloatTensor)
        assert torch.get_default_dtype() == torch.float32
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(TypeError) as t_err:
                torch.set_default_tensor_type("torch.LongTensor")
            with pytest.raises(type(t_err.value), match="holoflow"):
                flow.set_default_tensor_type("torch.LongTensor")
            with pytest.raises(TypeError, match="holoflow"):
                flow.set_default_tensor_type("torch.NoSuchTensor")
            if not torch.cuda.is_available():
                with pytest.raises(Exception) as t_err:
                    torch.set_default_tensor_type("torch.cuda.FloatTensor")
                with pytest.raises(type(t_err.value), match="holoflow"):
                    flow.set_default_tensor_type("torch.cuda.FloatTensor")
    finally:
        torch.set_default_dtype(torch.float32)


def test_device_modules_and_build_facts_are_torchs():
    for kind in ("mps", "xpu", "mtia"):
        assert getattr(flow, kind).is_available() == getattr(torch, kind).is_available()
    assert flow.xpu.device_count() == torch.xpu.device_count()
    assert (flow.has_lapack, flow.has_mkl, flow.has_openmp, flow.has_spectral) == \
        (torch.has_lapack, torch.has_mkl, torch.has_openmp, torch.has_spectral)
    assert flow.is_vulkan_available() == torch.is_vulkan_available()
    assert flow.compiled_with_cxx11_abi() == torch.compiled_with_cxx11_abi()
    assert flow.UntypedStorage is torch.UntypedStorage and isinstance(flow.ones(1).untyped_storage(), flow.UntypedStorage)
    g = _run("import torch\nok = torch.xpu.is_available() or torch.backends.mps.is_available() or torch.mps.is_available()")
    assert g["ok"] == (torch.xpu.is_available() or torch.mps.is_available())


def test_multiprocessing_is_torchs_and_moves_holoflow_tensors():
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler
    assert flow.multiprocessing.spawn is torch.multiprocessing.spawn
    assert flow.multiprocessing.get_sharing_strategy() == torch.multiprocessing.get_sharing_strategy()
    x = flow.arange(4.0).requires_grad_()
    buf = io.BytesIO()
    ForkingPickler(buf).dump(x)   # what a torch.multiprocessing queue does with it
    y = pickle.loads(buf.getvalue())
    assert isinstance(y, flow.Tensor) and y.requires_grad and y.tolist() == [0.0, 1.0, 2.0, 3.0]
    g = _run("import torch.multiprocessing as mp\nstart = mp.get_start_method(allow_none=True)\nspawn = mp.spawn")
    assert g["spawn"] is torch.multiprocessing.spawn


def test_to_dlpack_and_max_pool1d_with_indices_match_torch():
    x = torch.randn(2, 3, 7)
    back = torch.utils.dlpack.from_dlpack(flow.to_dlpack(flow.from_torch(x)))
    torch.testing.assert_close(back, x)
    for kw in ({}, {"stride": 1}, {"stride": 2, "padding": 1, "ceil_mode": True}):
        want = torch.max_pool1d_with_indices(x, 3, **kw)
        got = flow.max_pool1d_with_indices(flow.from_torch(x), 3, **kw)
        for g_, t_ in zip(got, want):
            torch.testing.assert_close(g_.to_torch(), t_)
    xt = x.clone().double().requires_grad_()
    xf = flow.from_torch(x.clone().double()).requires_grad_()
    torch.max_pool1d_with_indices(xt, 2)[0].sum().backward()
    flow.max_pool1d_with_indices(xf, 2)[0].sum().backward()
    torch.testing.assert_close(xf.grad.to_torch(), xt.grad)


def test_kernel_switches_are_torchs():
    assert flow.is_storage(flow.ones(2).untyped_storage()) and not flow.is_storage(flow.ones(2))
    assert flow.set_flush_denormal(False) == torch.set_flush_denormal(False)
    before = torch.get_deterministic_debug_mode()
    try:
        flow.set_deterministic_debug_mode("warn")
        assert torch.get_deterministic_debug_mode() == 1 == flow.get_deterministic_debug_mode()
        assert flow.is_deterministic_algorithms_warn_only_enabled() is torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.set_deterministic_debug_mode(before)
    assert flow.Stream is torch.Stream and flow.Event is torch.Event


def test_autocast_gpu_dtype_is_the_cuda_autocast_dtype():
    with pytest.warns(DeprecationWarning):
        assert flow.get_autocast_gpu_dtype() is flow.get_autocast_dtype("cuda") is flow.float16
    try:
        with pytest.warns(DeprecationWarning):
            flow.set_autocast_gpu_dtype(flow.bfloat16)
        assert flow.get_autocast_dtype("cuda") is flow.bfloat16
    finally:
        flow.set_autocast_dtype("cuda", flow.float16)


def test_range_is_end_inclusive_float_and_warns_like_torch():
    for args, kw in (((0, 3), {}), ((1, 2, 0.25), {}), ((0, 4), {"dtype": flow.int64}), ((3, 0, -1), {})):
        with pytest.warns(UserWarning, match="deprecated"):
            got = flow.range(*args, **kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tkw = {"dtype": torch.int64} if kw else {}
            want = torch.range(*args, **tkw)
        assert got.dtype == flow.from_torch(want).dtype
        torch.testing.assert_close(got.to_torch(), want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert flow.range(0, 2, requires_grad=True).requires_grad
        with pytest.raises(TypeError):   # torch requires an end
            torch.range(5)
        with pytest.raises(TypeError):
            flow.range(5)


def test_inplace_top_level_functions_match_torch():
    a, m, v = torch.randn(3), torch.randn(3, 2), torch.randn(2)
    fa = flow.from_torch(a.clone())
    out = flow.addmv_(fa, flow.from_torch(m), flow.from_torch(v), beta=0.5, alpha=2.0)
    assert out is fa
    torch.testing.assert_close(fa.to_torch(), torch.addmv_(a.clone(), m, v, beta=0.5, alpha=2.0))
    x = torch.arange(6.0)
    fx = flow.from_torch(x.clone())
    assert flow.as_strided_(fx, (2, 2), (1, 2), 1) is fx
    torch.testing.assert_close(fx.to_torch(), torch.as_strided_(x.clone(), (2, 2), (1, 2), 1))
    r = flow.zeros(2, 3)
    assert flow.resize_as_(r, flow.ones(3, 2)) is r and tuple(r.shape) == (3, 2)
    assert flow.is_distributed(r) is torch.is_distributed(torch.zeros(1)) is False


def test_as_strided_inplace_differentiates_like_torch():
    base = torch.randn(6, dtype=torch.float64)
    t = base.clone().requires_grad_()
    f = flow.from_torch(base.clone()).requires_grad_()
    ty, fy = t * 1.0, f * 1.0
    ty.as_strided_((2, 2), (1, 2))
    fy.as_strided_((2, 2), (1, 2))
    w = torch.randn(2, 2, dtype=torch.float64)
    (ty * w).sum().backward()
    (fy * flow.from_torch(w)).sum().backward()
    torch.testing.assert_close(f.grad.to_torch(), t.grad)
    with pytest.raises(RuntimeError, match="holoflow"):
        flow.ones(4, requires_grad=True).as_strided_((2,), (1,))


# -- Tensor methods ----------------------------------------------------------------------------------

def test_dense_layout_methods_answer_as_torch():
    x, t = flow.ones(2, 3), torch.ones(2, 3)
    assert x.to_dense() is x and t.to_dense() is t
    assert x.to_dense(flow.float64).dtype is flow.float64
    assert (x.dense_dim(), x.sparse_dim()) == (t.dense_dim(), t.sparse_dim()) == (2, 0)
    assert x.const_data_ptr() == x.data_ptr() == x.to_torch().data_ptr()
    for name in ("is_xla", "is_ipu", "is_mtia", "is_maia", "is_vulkan", "is_sparse_csr"):
        assert getattr(x, name) is getattr(t, name) is False, name
    assert x.is_distributed() is t.is_distributed() is False
    c = x.chalf()
    assert c.dtype is flow.complex32 and str(t.chalf().dtype).endswith("complex32")


def test_moves_to_absent_backends_raise_torchs_classes():
    x, t = flow.ones(2), torch.ones(2)
    for name in ("xpu", "ipu", "mtia"):
        try:
            getattr(t, name)()
        except Exception as e:   # noqa: BLE001 - the class is compared
            with pytest.raises(type(e), match="holoflow"):
                getattr(x, name)()
        else:
            pytest.skip(f"this machine has a {name} device")


def test_storage_access_shares_memory():
    x = flow.arange(4.0)
    s = x.untyped_storage()
    assert isinstance(s, torch.UntypedStorage) and s.nbytes() == 16 and s.data_ptr() == x.data_ptr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ts = x.storage()
    assert isinstance(ts, torch.TypedStorage) and ts.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_set_shares_the_source_like_torch():
    src, t_src = flow.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(2, 3)
    x, tx = flow.zeros(5), torch.zeros(5)
    assert x.set_(src) is x
    tx.set_(t_src)
    assert tuple(x.shape) == tuple(tx.shape) and x.stride() == tx.stride()
    x.add_(1)
    t_src.add_(1)
    torch.testing.assert_close(src.to_torch(), t_src)
    # a storage with offset, size and stride
    y, ty = flow.zeros(1), torch.zeros(1)
    y.set_(src.untyped_storage(), 1, (2, 2), (1, 2))
    ty.set_(t_src.untyped_storage(), 1, (2, 2), (1, 2))
    torch.testing.assert_close(y.to_torch(), ty)
    e, te = flow.ones(3).set_(), torch.ones(3).set_()
    assert tuple(e.shape) == tuple(te.shape) == (0,)
    with pytest.raises(RuntimeError) as t_err:
        torch.zeros(2).set_(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(type(t_err.value), match="holoflow"):
        flow.zeros(2).set_(flow.zeros(2, dtype=flow.int64))
    with pytest.raises(RuntimeError, match="holoflow"):
        flow.zeros(2, requires_grad=True).set_(flow.ones(2))


def test_set_and_storage_refuse_global_tensors():
    p = flow.placement("cpu", ranks=[0])
    g = flow.ones(2).to_global(p, flow.sbp.broadcast)
    for call in (lambda: g.set_(flow.ones(2)), g.untyped_storage, lambda: g.storage()):
        with pytest.raises(UnsupportedError, match="to_local"):
            call()


def test_tensor_methods_under_mock_torch():
    g = _run("""
import torch
x = torch.ones(2, 2)
flags = (x.is_xla, x.is_sparse_csr, x.to_dense() is x, x.dense_dim(), x.sparse_dim())
st = torch.is_storage(x.untyped_storage())
""")
    assert g["flags"] == (False, False, True, 2, 0) and g["st"] is True


def test_submodules_resolve_under_mock_torch():
    g = _run("""
import torch
import torch.random, torch.compiler, torch.cpu, torch.profiler, torch.functional
from torch.cpu.amp import autocast
torch.random.manual_seed(0)
a = torch.randn(2)
with torch.random.fork_rng():
    torch.randn(3)
b = torch.randn(2)
ok = torch.cpu.is_available() and not torch.compiler.is_compiling()
mod = torch.get_device_module('cpu')
""")
    flow.manual_seed(0)
    want = flow.randn(4).to_torch()
    torch.testing.assert_close(g["a"].to_torch(), want[:2])
    torch.testing.assert_close(g["b"].to_torch(), want[2:])
    assert g["ok"] is True and g["mod"] is flow.cpu
