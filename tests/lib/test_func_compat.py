"""holoflow.func against torch.func where a compat hunt found gaps: jacrev's chunk_size and
jacfwd's randomness, vmap's keyword arguments, None in_dims/out_dims, pytree prefixes, chunk_size,
empty batches and its errors, linearize, jvp's strict, functionalize, debug_unwrap,
replace_all_batch_norm_modules_, stack_module_state's requires_grad, rearrange, and the signatures and
exception classes of every public name. Each case runs the same function on both libraries."""
import inspect

import pytest
import torch

import holoflow as flow

from .test_func import _close, _f, _rand


def _both(make):
    """``make(lib)`` for torch and for holoflow: (holoflow's result, torch's result)."""
    return make(flow), make(torch)


def _raised(make, lib):
    try:
        make(lib)
    except Exception as e:   # noqa: BLE001  (the class is what is compared)
        return type(e)
    return None


def _same_error(make):
    """Both libraries refuse ``make(lib)``, with the same exception class."""
    got, want = _raised(make, flow), _raised(make, torch)
    assert want is not None, "torch accepts this case: not an error case"
    assert got is want, f"holoflow raised {got}, torch {want}"


def _lift(lib, x):
    return _f(x) if lib is flow else x


# -- names and signatures -----------------------------------------------------------------------------

def test_every_torch_func_name_is_there_with_torchs_signature():
    assert {n for n in dir(torch.func) if not n.startswith("_") and not hasattr(flow.func, n)} == set()
    for name in flow.func.__all__:
        ours = inspect.signature(getattr(flow.func, name)).parameters
        theirs = inspect.signature(getattr(torch.func, name)).parameters
        assert [(p.name, p.kind) for p in ours.values()] == [(p.name, p.kind) for p in theirs.values()], name


def test_mock_torch_exposes_the_new_names_as_torch_func():
    from holoflow import mock_torch
    real_func = [n for n in dir(torch.func) if not n.startswith("_")]
    with mock_torch.enable():
        import torch.func as mocked
        from torch.func import linearize, replace_all_batch_norm_modules_
        assert mocked.jacrev is flow.func.jacrev and linearize is flow.func.linearize
        assert replace_all_batch_norm_modules_ is flow.func.replace_all_batch_norm_modules_
        assert mocked.functionalize is flow.func.functionalize and mocked.debug_unwrap is flow.func.debug_unwrap
        assert mocked.rearrange is flow.func.rearrange and set(real_func) <= set(dir(mocked))


def test_functional_call_args_none_and_bad_dicts_as_torch():
    """(holoflow passed args=None on as one argument, and failed on a non-dict with a TypeError)"""
    def run(lib):
        class Count(lib.nn.Module):
            def forward(self, *a):
                return len(a)
        m = Count()
        return [lib.func.functional_call(m, {}, a) for a in (None, (), [1, 2], (1, 2))]
    got, want = _both(run)
    assert got == want == [0, 0, 1, 2]
    _same_error(lambda lib: lib.func.functional_call(lib.nn.Linear(2, 2), [{}, 3], ()))
    _same_error(lambda lib: lib.func.functional_call(lib.nn.Linear(2, 2), 3, ()))


# -- jacrev / jacfwd ----------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk_size", [None, 1, 2, 5, 100])
def test_jacrev_chunk_size_gives_torchs_jacobian(chunk_size):
    x, y = _rand(3, 2), _rand(2, seed=1)

    def make(lib):
        f = lambda a, b: (lib.sin(a) * b, (a @ b).exp())  # noqa: E731
        return lib.func.jacrev(f, (0, 1), chunk_size=chunk_size)(_lift(lib, x), _lift(lib, y))
    got, want = _both(make)
    _close(got, want)


def test_jacrev_chunk_size_and_jacfwd_randomness_errors_are_torchs():
    x = _rand(3)
    _same_error(lambda lib: lib.func.jacrev(lib.sin, chunk_size=0)(_lift(lib, x)))
    _same_error(lambda lib: lib.func.jacrev(lib.sin, chunk_size=-2)(_lift(lib, x)))
    _same_error(lambda lib: lib.func.jacrev(lib.sin, chunk_size=1.5)(_lift(lib, x)))
    _same_error(lambda lib: lib.func.jacfwd(lib.sin, randomness="sometimes")(_lift(lib, x)))
    drop = lambda lib: lambda a: lib.nn.functional.dropout(a, 0.5)  # noqa: E731
    _same_error(lambda lib: lib.func.jacfwd(drop(lib))(_lift(lib, x)))
    with pytest.raises(RuntimeError, match=r"holoflow\.func\.jacfwd: the function draws random numbers"):
        flow.func.jacfwd(drop(flow))(_f(x))
    # one draw for every column: the Jacobian of a dropout is diagonal, 0 or 2 on it
    j = flow.func.jacfwd(drop(flow), randomness="same")(_f(x)).to_torch()
    assert torch.equal(j, torch.diag(torch.diagonal(j))) and set(torch.diagonal(j).tolist()) <= {0.0, 2.0}
    assert flow.func.jacrev(drop(flow))(_f(x)).shape == (3, 3)      # jacrev allows draws, as torch's


def test_jacobians_refuse_non_tensor_inputs_with_torchs_class():
    _same_error(lambda lib: lib.func.jacrev(lambda a: a)(3))
    _same_error(lambda lib: lib.func.grad(lambda a: a)(3.0))
    _same_error(lambda lib: lib.func.vjp(lambda a: a, 3))
    _same_error(lambda lib: lib.func.jacrev(lambda a: 3)(_lift(lib, _rand(2))))


def test_argnums_must_be_an_int_or_a_tuple_of_distinct_ints_as_torch():
    """(holoflow took a list and a repeated position, and failed on a float with a TypeError)"""
    x = _rand(3)
    for argnums in ([0, 1], 0.5, (0, 0), (1, -1), (), 2):
        for transform in ("grad", "jacrev", "jacfwd"):
            _same_error(lambda lib: getattr(lib.func, transform)(lambda a, b: (a * b).sum(), argnums=argnums)(
                _lift(lib, x), _lift(lib, x)))
    with pytest.raises(RuntimeError, match=r"holoflow\.func\.grad: argnums must be an int or a non-empty tuple of "
                                           r"distinct ints indexing the 2 positional argument\(s\); \(0, 0\)"):
        flow.func.grad(lambda a, b: a.sum(), argnums=(0, 0))(_f(x), _f(x))


# -- vmap -----------------------------------------------------------------------------------------------

def test_vmap_passes_keyword_arguments_unmapped():
    x, s, m = _rand(3, 4), _rand(4, seed=1), _rand(3, 4, seed=2)

    def make(lib):
        f = lambda a, scale, shift=0: a * scale + shift  # noqa: E731
        v = lib.func.vmap(f)
        return (v(_lift(lib, x), scale=_lift(lib, s)), v(_lift(lib, x), scale=_lift(lib, s), shift=_lift(lib, m)))
    got, want = _both(make)
    _close(got, want)
    assert want[1].shape == (3, 3, 4)        # the keyword tensor is not mapped: broadcast per sample


def test_vmap_out_dims_none_returns_non_tensors_and_unmapped_tensors_as_given():
    x, c = _rand(3, 4), _rand(2, seed=1)

    def make(lib):
        cl = _lift(lib, c)
        v = lib.func.vmap
        return (v(lambda a: (a * 2, 3), out_dims=(0, None))(_lift(lib, x)),
                v(lambda a: 7.5, out_dims=None)(_lift(lib, x)),
                v(lambda a: None, out_dims=None)(_lift(lib, x)),
                v(lambda a: cl * 2, out_dims=None)(_lift(lib, x)),
                v(lambda a: cl * 2)(_lift(lib, x)),
                v(lambda a: {"u": a, "v": (a.sum(), 2.5)}, out_dims={"u": 1, "v": (0, None)})(_lift(lib, x)),
                v(lambda a: ((a, a), [a.sum()]), out_dims=(1, [0]))(_lift(lib, x)))
    got, want = _both(make)
    _close(got, want)


def test_vmap_out_dims_errors_are_torchs():
    x = _rand(3, 4)
    for make in (lambda lib: lib.func.vmap(lambda a: (a, 3))(_lift(lib, x)),              # an int, out_dim 0
                 lambda lib: lib.func.vmap(lambda a: (a, None))(_lift(lib, x)),
                 lambda lib: lib.func.vmap(lambda a: a * 2, out_dims=None)(_lift(lib, x)),  # mapped, out_dim None
                 lambda lib: lib.func.vmap(lambda a: a, out_dims="x")(_lift(lib, x)),
                 lambda lib: lib.func.vmap(lambda a: (a, a), out_dims=(0, 0.5))(_lift(lib, x)),
                 lambda lib: lib.func.vmap(lambda a: (a, a), out_dims=(0, 0, 0))(_lift(lib, x)),
                 lambda lib: lib.func.vmap(lambda a: (a, a), out_dims=[0, 1])(_lift(lib, x)),   # list for a tuple
                 lambda lib: lib.func.vmap(lambda a: a, out_dims=3)(_lift(lib, x))):          # out of range
        _same_error(make)
    with pytest.raises(IndexError, match="out of range"):
        flow.func.vmap(lambda a: a, out_dims=-3)(_f(x))      # (the old code wrapped it round: dim 1)


def test_vmap_in_dims_prefixes_with_none_and_nested_entries():
    x, w, b = _rand(3, 4), _rand(4, 2, seed=1), _rand(2, seed=2)
    y = _rand(4, 3, seed=3)

    def make(lib):
        L = lambda t: _lift(lib, t)  # noqa: E731
        f = lambda d, z: (d["x"] @ d["p"][0] + d["p"][1]) * z.sum()  # noqa: E731
        v = lib.func.vmap
        return (v(f, in_dims=({"x": 0, "p": None}, 1))({"x": L(x), "p": (L(w), L(b))}, L(y)),
                v(f, in_dims=({"x": 0, "p": [None, None]}, None))({"x": L(x), "p": [L(w), L(b)]}, L(y)),
                v(lambda a, n: a * n, in_dims=(0, None))(L(x), 3),
                v(lambda a, z: a if z is None else z, in_dims=(0, None))(L(x), None))
    got, want = _both(make)
    _close(got, want)


def test_vmap_in_dims_errors_are_torchs():
    x = _rand(3, 4)
    cases = [lambda lib: lib.func.vmap(lambda a: a, in_dims="x")(_lift(lib, x)),
             lambda lib: lib.func.vmap(lambda a: a, in_dims=None)(_lift(lib, x)),
             lambda lib: lib.func.vmap(lambda a, b: a + b, in_dims=[0, 0])(_lift(lib, x), _lift(lib, x)),
             lambda lib: lib.func.vmap(lambda a: a, in_dims=(0.5,))(_lift(lib, x)),
             lambda lib: lib.func.vmap(lambda a: a, in_dims=(0, 1))(_lift(lib, x)),
             lambda lib: lib.func.vmap(lambda a: a, in_dims=5)(_lift(lib, x)),
             lambda lib: lib.func.vmap(lambda a: a, in_dims=(None,))(_lift(lib, x)),
             lambda lib: lib.func.vmap(lambda a, b: a, in_dims=(0, 1))(_lift(lib, x), _lift(lib, x)),
             lambda lib: lib.func.vmap(lambda: 1)(),
             lambda lib: lib.func.vmap(lambda a, b: a)(_lift(lib, x), 3),
             lambda lib: lib.func.vmap(lambda a, b: a)(_lift(lib, x), None),
             lambda lib: lib.func.vmap(lambda d: d["a"], in_dims=({"a": 0, "c": 0},))({"a": _lift(lib, x)}),
             lambda lib: lib.func.vmap(lambda d: d[0], in_dims=([0, 0],))((_lift(lib, x), _lift(lib, x))),
             lambda lib: lib.func.vmap(lambda a: a, randomness="sometimes"),
             lambda lib: lib.func.vmap(lambda a: a, chunk_size=0),
             lambda lib: lib.func.vmap(lambda a: a, chunk_size=-1),
             lambda lib: lib.func.vmap(lambda a: a, chunk_size=1.5)(_lift(lib, x))]
    for make in cases:
        _same_error(make)
    with pytest.raises(ValueError, match=r"holoflow\.func\.vmap\(<lambda>, in_dims=5\): got in_dim=5 for a tensor "
                                         r"of dimensionality 2; expected -2 <= in_dim < 2"):
        cases[5](flow)


def test_gradients_flow_through_vmap_with_keywords_and_unmapped_outputs():
    x, w, b = _rand(4, 3), _rand(3, seed=1), _rand(3, seed=2)

    def run(lib):
        def loss(w, b):
            f = lambda xi, scale: ((xi * w).sin() * scale, b * 2)  # noqa: E731
            mapped, shared = lib.func.vmap(f, out_dims=(1, None))(_lift(lib, x), scale=b)
            return mapped.sum() + shared.pow(2).sum()
        return lib.func.grad(loss, argnums=(0, 1))(_lift(lib, w), _lift(lib, b))
    got, want = _both(run)
    _close(got, want)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 10])
def test_vmap_chunk_size_gives_torchs_results(chunk_size):
    x, y = _rand(5, 3), _rand(3, 5, seed=1)

    def make(lib):
        f = lambda a, b: (lib.tanh(a) * b, a.sum())  # noqa: E731
        return lib.func.vmap(f, in_dims=(0, 1), out_dims=(1, 0), chunk_size=chunk_size)(_lift(lib, x), _lift(lib, y))
    got, want = _both(make)
    _close(got, want)


def test_vmap_over_an_empty_batch():
    """(the old code indexed the first of no results: an IndexError)"""
    def make(lib):
        x, c = _lift(lib, torch.ones(0, 3, 2, dtype=torch.float64)), _lift(lib, _rand(3))
        return (lib.func.vmap(lambda a: (a.sum(0), a.T), out_dims=(0, 2))(x),
                lib.func.vmap(lambda a: (c * 2, a), in_dims=1, out_dims=(None, 0))(x.transpose(0, 1)))
    got, want = _both(make)
    assert [tuple(t.shape) for t in flow.func._vmap.flatten(got)[0]] == [(0, 2), (2, 3, 0), (3,), (0, 3, 2)]
    _close(got, want)


def test_vmap_keeps_the_functions_name():
    def scaled(a):
        return a * 2
    assert flow.func.vmap(scaled).__name__ == torch.func.vmap(scaled).__name__ == "scaled"


# -- linearize / jvp -------------------------------------------------------------------------------------

def test_linearize_matches_torch_over_several_tangents():
    x, y = _rand(3, 4), _rand(3, 4, seed=1)

    def f(lib):
        return lambda a, b: ((lib.sin(a) * b).sum(1), {"e": (a @ b.T).exp(), "k": b * 0 + 1})
    (fo, ffn), (to, tfn) = _both(lambda lib: lib.func.linearize(f(lib), _lift(lib, x), _lift(lib, y)))
    _close(fo, to)
    for seed in (2, 3):
        tx, ty = _rand(3, 4, seed=seed), _rand(3, 4, seed=seed + 10)
        _close(ffn(_f(tx), _f(ty)), tfn(tx, ty))
        _close(flow.func.jvp(f(flow), (_f(x), _f(y)), (_f(tx), _f(ty)))[1], tfn(tx, ty))


def test_linearize_of_dict_primals_and_unused_ones():
    p, z = {"w": _rand(4, 2), "b": _rand(2, seed=1)}, _rand(3, seed=2)
    tp = {"w": _rand(4, 2, seed=3), "b": _rand(2, seed=4)}

    def make(lib):
        out, fn = lib.func.linearize(lambda d, u: lib.tanh(d["w"].sum(0) + d["b"]), _lift(lib, p), _lift(lib, z))
        return out, fn(_lift(lib, tp), _lift(lib, z))
    got, want = _both(make)
    _close(got, want)


def test_linearize_keeps_the_output_differentiable_as_torch():
    x = _rand(3)
    outs = []
    for lib in (flow, torch):
        xs = _lift(lib, x).requires_grad_(True)
        out, _ = lib.func.linearize(lambda a: a.sin() * a, xs)
        outs.append(out.requires_grad)
        (g,) = lib.autograd.grad(out.sum(), xs)
        outs.append(g)
    assert outs[0] is outs[2] is True
    _close(outs[1], outs[3])


def test_linearize_and_jvp_errors_are_torchs():
    x = _rand(3, 4)

    def fn(lib):
        return lib.func.linearize(lambda a, b: a * b, _lift(lib, x), _lift(lib, x))[1]
    _same_error(lambda lib: fn(lib)(_lift(lib, x)))                                  # one tangent for two
    _same_error(lambda lib: fn(lib)(_lift(lib, x), _lift(lib, torch.ones(2))))       # a shape
    _same_error(lambda lib: fn(lib)(_lift(lib, x), _lift(lib, x.float())))            # a dtype
    _same_error(lambda lib: fn(lib)((_lift(lib, x), _lift(lib, x))))                 # a tuple for two args
    _same_error(lambda lib: lib.func.jvp(lambda a: a * 2, _lift(lib, x), _lift(lib, x)))   # not tuples
    _same_error(lambda lib: lib.func.jvp(lambda a: _lift(lib, x) * 2, (_lift(lib, x),), (_lift(lib, x),),
                                         strict=True))
    with pytest.raises(RuntimeError, match=r"holoflow\.func\.linearize: tangent 1 of shape \(2,\)"):
        fn(flow)(_f(x), flow.ones(2))


def test_jvp_strict_allows_outputs_that_depend_on_the_primals():
    x, t = _rand(3), _rand(3, seed=1)
    got, want = _both(lambda lib: lib.func.jvp(lib.sin, (_lift(lib, x),), (_lift(lib, t),), strict=True))
    _close(got, want)


# -- functionalize / debug_unwrap ------------------------------------------------------------------------

def test_functionalize_keeps_results_and_writes_to_inputs():
    for remove in ("mutations", "mutations_and_views"):
        def run(lib):
            def f(a, b):
                a.add_(1)
                v = b.view(-1)
                v.mul_(2)
                return a * b, v[:2]
            a, b = _lift(lib, _rand(2, 3)), _lift(lib, _rand(2, 3, seed=1))
            out = lib.func.functionalize(f, remove=remove)(a, b)
            return out, a, b
        got, want = _both(run)
        _close(got, want)
    _same_error(lambda lib: lib.func.functionalize(lambda a: a, remove="views"))


def test_functionalize_composes_with_grad():
    x = _rand(4)

    def run(lib):
        def f(a):
            b = a.clone()
            b.mul_(a)
            return b.sum()
        return lib.func.grad(lib.func.functionalize(f))(_lift(lib, x))
    got, want = _both(run)
    _close(got, want)


def test_debug_unwrap_of_a_plain_tensor_is_itself():
    for lib in (flow, torch):
        x = _lift(lib, _rand(2))
        assert lib.func.debug_unwrap(x) is x and lib.func.debug_unwrap(x, recurse=False) is x
    _same_error(lambda lib: lib.func.debug_unwrap(3))


# -- modules -----------------------------------------------------------------------------------------------

def _bn_nets(lib):
    lib.manual_seed(0)
    return lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.BatchNorm1d(4), lib.nn.Sequential(lib.nn.BatchNorm1d(4)))


def test_replace_all_batch_norm_modules_then_vmap_a_training_model():
    fm, tm = _bn_nets(flow), _bn_nets(torch)
    tm.load_state_dict({k: v.to_torch() for k, v in fm.state_dict().items()})
    assert flow.func.replace_all_batch_norm_modules_(fm) is fm
    torch.func.replace_all_batch_norm_modules_(tm)
    for f, t in zip(fm.modules(), tm.modules()):
        if isinstance(t, torch.nn.BatchNorm1d):
            assert (f.running_mean, f.running_var, f.num_batches_tracked, f.track_running_stats) == \
                (None, None, None, False) == (t.running_mean, t.running_var, t.num_batches_tracked,
                                              t.track_running_stats)
    assert [k for k, _ in fm.named_buffers()] == [k for k, _ in tm.named_buffers()] == []
    x = _rand(2, 5, 3, seed=1).float()

    def run(lib, m):
        params = {k: v.detach() for k, v in m.named_parameters()}
        loss = lambda p, xb: lib.func.functional_call(m, p, (xb,)).pow(2).sum()  # noqa: E731
        return lib.func.vmap(lib.func.grad_and_value(loss), in_dims=(None, 0))(params, _lift(lib, x))
    _close(run(flow, fm), run(torch, tm), tol=1e-4)


def test_stack_module_state_requires_grad_and_errors_as_torch():
    def stacked(lib, freeze):
        lib.manual_seed(0)
        ms = [lib.nn.Linear(2, 2) for _ in range(3)]
        for m in ms:
            m.weight.requires_grad_(not freeze)
        return {k: v.requires_grad for k, v in lib.func.stack_module_state(ms)[0].items()}
    for freeze in (False, True):
        got, want = stacked(flow, freeze), stacked(torch, freeze)
        assert got == want and got["weight"] is not freeze

    def mixed(lib):
        ms = [lib.nn.Linear(2, 2), lib.nn.Linear(2, 2)]
        ms[1].bias.requires_grad_(False)
        return lib.func.stack_module_state(ms)
    _same_error(mixed)
    _same_error(lambda lib: lib.func.stack_module_state([lib.nn.Linear(2, 2), lib.nn.Linear(2, 2).eval()]))
    _same_error(lambda lib: lib.func.stack_module_state([lib.nn.Linear(2, 2), lib.nn.Bilinear(2, 2, 2)]))
    _same_error(lambda lib: lib.func.stack_module_state([]))


# -- rearrange -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, lengths", [
    ("a b c -> c (a b)", {}), ("a ... -> ... a", {}), ("... c -> (...) c", {}), ("a b c -> (a b c)", {}),
    ("a b (c d) -> a b c d", {"d": 2}), ("a b c -> b 1 c a ()", {}), ("(a1 a2) b c -> a1 a2 b c", {"a1": 1}),
    ("a b c -> c b a", {"a": 2, "b": 3}), ("a ... c -> c (...) a", {}), ("a b c d ... -> d (c a) ... b", {}),
    ("b (h h1) (w w1) -> b h w (h1 w1)", {"h1": 3, "w1": 2})])
def test_rearrange_as_torch(pattern, lengths):
    x = _rand(2, 3, 4, 1) if "d ..." in pattern else _rand(2, 3, 4)
    x = _rand(2, 6, 4) if "h1" in pattern else x
    got, want = _both(lambda lib: lib.func.rearrange(_lift(lib, x), pattern, **lengths))
    _close(got, want)
    got, want = _both(lambda lib: lib.func.rearrange([_lift(lib, x), _lift(lib, x * 2)], "n a ... -> a (n ...)"))
    _close(got, want)


@pytest.mark.parametrize("pattern, lengths", [
    ("a b c -> a b d", {}), ("a b -> a b", {}), ("a b c -> a a b c", {}), ("a b c", {}), ("a b c -> b 2 c a", {}),
    ("a b c -> c b a)", {}), ("... b c ... -> c b", {}), ("a b c -> c b a", {"e": 5}),
    ("a b c () -> a b c", {})])
def test_rearrange_errors_are_torchs_value_errors(pattern, lengths):
    _same_error(lambda lib: lib.func.rearrange(_lift(lib, _rand(2, 3, 4)), pattern, **lengths))
    with pytest.raises(ValueError, match=r"holoflow\.func\.rearrange: "):
        flow.func.rearrange(_f(_rand(2, 3, 4)), pattern, **lengths)


def test_rearrange_size_errors():
    """(torch raises functorch.dim's DimensionBindError, an Exception; holoflow a ValueError)"""
    x = _f(_rand(2, 3, 4))
    with pytest.raises(ValueError, match=r"cannot infer the sizes of \['c', 'd'\] at once"):
        flow.func.rearrange(x, "a b (c d) -> a b c d")
    with pytest.raises(ValueError, match="does not match the sizes given"):
        flow.func.rearrange(x, "a b c -> c b a", a=5)
    with pytest.raises(ValueError, match=r"dim of size 4 does not split evenly into \['c', 'd'\]"):
        flow.func.rearrange(x, "a b (c d) -> a b c d", d=3)
    for bad, lengths in (("a b (c d) -> a b c d", {}), ("a b c -> c b a", {"a": 5}), ("a b (c d) -> a b c d", {"d": 3})):
        with pytest.raises(Exception, match="cannot infer|do not match|does not evenly fit"):
            torch.func.rearrange(_rand(2, 3, 4), bad, **lengths)
