"""nn.Module API found missing or different from torch by probing: each case runs the same code
on torch and on holoflow and compares the results (or exception classes)."""
import pytest
import torch

import holoflow as flow
from holoflow import nn


def _plain(x):
    if isinstance(x, flow.Tensor):
        return x.to_torch().detach().tolist()
    if isinstance(x, torch.Tensor):
        return x.detach().tolist()
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _both(fn):
    out = []
    for lib, tlib in ((torch.nn, torch), (nn, flow)):
        try:
            out.append(("ok", _plain(fn(lib, tlib))))
        except Exception as e:  # noqa: BLE001 - the class is what is compared
            out.append(("raised", type(e).__name__))
    assert out[1] == out[0]


def test_state_dict_hooks():
    def case(lib, t):
        log = []
        m = lib.Sequential(lib.Linear(1, 1))
        m[0]._register_state_dict_hook(lambda mod, sd, prefix, lm: log.append(("sd", prefix, sorted(sd))))
        m[0].register_state_dict_post_hook(lambda mod, sd, prefix, lm: log.append(("post_sd", prefix)))
        m.register_state_dict_pre_hook(lambda mod, prefix, keep: log.append(("pre_sd", prefix, keep)))
        m.register_load_state_dict_pre_hook(lambda mod, sd, prefix, *rest: log.append(("pre", prefix)))
        h = m[0].register_load_state_dict_post_hook(lambda mod, inc: log.append(("post", list(inc.missing_keys))))
        m.load_state_dict(m.state_dict(keep_vars=True))
        m.load_state_dict({"0.weight": t.ones(1, 1)}, strict=False)
        h.remove()
        m.load_state_dict({"0.weight": t.ones(1, 1)}, strict=False)
        return log
    _both(case)


def test_load_state_dict_post_hook_can_clear_keys():
    def case(lib, t):
        m = lib.Linear(1, 1)
        m.register_load_state_dict_post_hook(lambda mod, inc: inc.missing_keys.clear())
        r = m.load_state_dict({"weight": t.ones(1, 1)})  # strict, but the hook forgave "bias"
        return list(r.missing_keys), m.weight
    _both(case)


@pytest.mark.parametrize("target,strict,value", [
    ("0.0", False, "relu"), ("0.5", False, "relu"), ("1.5", False, "relu"), ("0.0", False, 3),
    ("", False, "relu"), ("0.7", True, "relu"), ("0.0", True, "relu"), ("0.0.weight", False, "relu"),
])
def test_set_submodule(target, strict, value):
    def case(lib, t):
        m = lib.Sequential(lib.Sequential(lib.Linear(1, 1)))
        m.set_submodule(target, lib.ReLU() if value == "relu" else value, strict=strict)
        return [n for n, _ in m.named_modules()], [type(x).__name__ for x in m.modules()]
    _both(case)


def test_full_backward_pre_hook():
    def case(lib, t):
        log = []

        class M(lib.Module):
            def forward(self, a, b):
                return a * b, a + b
        m = M()
        m.register_full_backward_pre_hook(lambda mod, go: log.append(("pre", list(go))))
        m.register_full_backward_hook(lambda mod, gi, go: log.append(("h", gi[0], list(go))))
        a, b = t.tensor([2.0], requires_grad=True), t.tensor([3.0])
        x, y = m(a, b)
        (x * 5 + y).sum().backward()
        return log, a.grad
    _both(case)


def test_full_backward_pre_hook_modifies_grad_output():
    def case(lib, t):
        m = lib.Linear(2, 1)
        with t.no_grad():
            m.weight.fill_(1.0)
        h = m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 10,))
        m.register_full_backward_hook(lambda mod, gi, go: (gi[0] * 2,))
        a = t.ones(1, 2, requires_grad=True)
        m(a).sum().backward()
        out = [a.grad.clone(), m.weight.grad.clone()]
        h.remove()
        a.grad = None
        m(a).sum().backward()
        return out + [a.grad]
    _both(case)


def test_full_backward_hook_input_without_grad():
    def case(lib, t):
        log = []
        m = lib.Linear(2, 1)
        m.register_full_backward_hook(lambda mod, gi, go: log.append((gi, [g.shape for g in go])))
        m(t.ones(1, 2)).sum().backward()  # only the weights need gradients
        return [(gi, [list(s) for s in shapes]) for gi, shapes in log]
    with pytest.warns(UserWarning):  # torch warns that the hook fires on outputs only
        _both(case)


def test_global_forward_hooks():
    def case(lib, t):
        log = []
        mm = lib.modules.module
        m = lib.Sequential(lib.ReLU())
        h1 = mm.register_module_forward_pre_hook(lambda mod, a: log.append(("gpre", type(mod).__name__)))
        h2 = mm.register_module_forward_hook(lambda mod, a, o: log.append(("g", type(mod).__name__)))
        h3 = mm.register_module_forward_hook(lambda mod, a, k, o: o * 2, with_kwargs=True)
        m.register_forward_hook(lambda mod, a, o: log.append(("local", o.tolist())))
        try:
            y = m(t.ones(1))
        finally:
            h1.remove(), h2.remove(), h3.remove()
        return log, y, m(t.ones(1))
    _both(case)


def test_sequential_mul_and_parameterdict_or():
    def case(lib, t):
        s = lib.Sequential(lib.ReLU(), lib.Tanh())
        out = [[type(x).__name__ for x in s * 2], [type(x).__name__ for x in 2 * s]]
        s *= 3
        out.append(list(s._modules))
        for bad in (lambda: s * 0, lambda: s * 1.5):
            try:
                bad()
            except Exception as e:  # noqa: BLE001
                out.append(type(e).__name__)
        p = lib.ParameterDict({"a": t.ones(1), "b": t.ones(2)})
        q = p | lib.ParameterDict({"c": t.ones(3)})
        p |= {"d": t.zeros(1)}
        out += [list(q), list(p), p.setdefault("e", t.ones(4)).shape[0], p.popitem()[0], list(reversed(p)),
                list(p.copy()), list(p.fromkeys(["x", "y"], t.ones(1)))]
        return out
    _both(case)


def test_module_compile_is_in_place():
    def case(lib, t):
        m = lib.Linear(2, 2)
        with t.no_grad():
            m.weight.fill_(1.0)
            m.bias.fill_(0.5)
        return m.compile(), m(t.ones(1, 2))
    _both(case)


def test_full_backward_hook_skipped_for_dict_output():
    def case(lib, t):
        log = []

        class M(lib.Module):
            def forward(self, x):
                return {"a": x * 2}
        m = M()
        m.register_full_backward_hook(lambda mod, gi, go: log.append(len(go)))
        a = t.ones(2, requires_grad=True)
        m(a)["a"].sum().backward()  # the gradient never passes a tensor output: no hook call
        return log, a.grad
    _both(case)


def test_parametrized_module_pickle_refused_deepcopy_works():
    import copy
    import pickle

    def case(lib, t):
        m = lib.utils.parametrizations.weight_norm(lib.Linear(2, 2))
        m2 = copy.deepcopy(m)
        with t.no_grad():
            m2.parametrizations.weight.original0.fill_(1.0)
            m2.parametrizations.weight.original1.fill_(2.0)
        out = [type(m2).__name__, list(m2.state_dict()), m2.weight,
               m2.parametrizations.weight.original0 is not m.parametrizations.weight.original0]
        try:
            pickle.dumps(m)
        except Exception as e:  # noqa: BLE001
            out.append(type(e).__name__)
        return out
    _both(case)


def test_share_memory():
    def case(lib, t):
        m = lib.BatchNorm1d(2)
        return m.share_memory() is m, [p.is_shared() for p in m.state_dict().values()]
    _both(case)


@pytest.mark.parametrize("where", ["pre_hook", "forward", "forward_hook"])
def test_always_call_hook_when_something_raises(where):
    def case(lib, t):
        log = []

        class M(lib.Module):
            def forward(self, x):
                if where == "forward":
                    raise ValueError("forward")
                return x + 1

        def boom(*a):
            raise ValueError(where)
        m = M()
        if where == "pre_hook":
            m.register_forward_pre_hook(boom)
        if where == "forward_hook":
            m.register_forward_hook(boom)
        m.register_forward_hook(lambda mod, a, o: log.append(("always", o)), always_call=True)
        try:
            m(1)
        except ValueError as e:
            log.append(("raised", str(e)))
        return log
    _both(case)


def test_sequential_insert_rejects_non_module():
    def case(lib, t):
        s = lib.Sequential(lib.ReLU(), lib.Tanh())
        try:
            s.insert(1, 3)
        except Exception as e:  # noqa: BLE001
            return type(e).__name__, len(s), [type(x).__name__ for x in s]
    _both(case)


def test_private_load_state_dict_pre_hook():
    def case(lib, t):
        log = []
        m = lib.Sequential(lib.Linear(1, 1))

        def rename(sd, prefix, *rest):  # an old checkpoint's key, renamed on load
            if prefix + "w" in sd:
                sd[prefix + "weight"] = sd.pop(prefix + "w")
        m[0]._register_load_state_dict_pre_hook(rename)
        m._register_load_state_dict_pre_hook(lambda mod, sd, prefix, *rest: log.append((type(mod).__name__, prefix)),
                                             with_module=True)
        r = m.load_state_dict({"0.w": t.ones(1, 1) * 3, "0.bias": t.zeros(1)})
        return log, list(r.missing_keys), m[0].weight
    _both(case)


@pytest.mark.parametrize("leave", [True, False])
def test_parametrized_buffer_stays_a_buffer(leave):
    def case(lib, t):
        P = lib.utils.parametrize

        class Double(lib.Module):
            def forward(self, x):
                return x * 2

        m = lib.Module()
        m.register_buffer("b", t.ones(2))
        P.register_parametrization(m, "b", Double())
        out = [m.b, list(m.state_dict()), [n for n, _ in m.named_buffers()], [n for n, _ in m.named_parameters()]]
        P.remove_parametrizations(m, "b", leave_parametrized=leave)
        return out + [m.b, list(m._buffers), list(m._parameters), m.b.requires_grad]
    _both(case)


def test_global_full_backward_hooks():
    def case(lib, t):
        log = []
        mm = lib.modules.module
        m = lib.Linear(1, 1)
        with t.no_grad():
            m.weight.fill_(2.0)
        m.register_full_backward_hook(lambda mod, gi, go: log.append(("local", gi)))
        h1 = mm.register_module_full_backward_hook(lambda mod, gi, go: log.append(("g", type(mod).__name__, gi)))
        h2 = mm.register_module_full_backward_pre_hook(lambda mod, go: (go[0] * 3,))
        a = t.ones(1, 1, requires_grad=True)
        try:
            m(a).sum().backward()
        finally:
            h1.remove(), h2.remove()
        return log, a.grad
    _both(case)


def test_call_super_init_passes_arguments_on():
    def case(lib, t):
        class Base:
            def __init__(self, a=0, **kw):
                self.a = a
                super().__init__(**kw)

        class M(lib.Module, Base):
            call_super_init = True

            def __init__(self, **kw):
                super().__init__(**kw)

        class Plain(lib.Module):
            def __init__(self, **kw):
                super().__init__(**kw)
        out = [M().a, M(a=5).a, M().training]
        try:
            Plain(a=1)
        except Exception as e:  # noqa: BLE001
            out.append(type(e).__name__)
        return out
    _both(case)
