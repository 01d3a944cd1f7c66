"""holoflow.autograd.functional against torch.autograd.functional: values, the tuple/tensor
structure of results, strict-mode errors and create_graph (differentiating the results again)."""
import pytest
import torch
import torch.autograd.functional as TF

import holoflow as flow
import holoflow.autograd.functional as HF

torch.manual_seed(0)
X = torch.randn(2, 3, dtype=torch.float64)
W = torch.randn(3, 4, dtype=torch.float64)
S = torch.randn(3, dtype=torch.float64)


def to_lib(lib, t, requires_grad=False):
    return t.clone().requires_grad_(requires_grad) if lib is torch else flow.tensor(t.numpy(), requires_grad=requires_grad)


def conv(lib, t, requires_grad=False):
    """A tensor or tuple of tensors for ``lib``."""
    if isinstance(t, tuple):
        return tuple(to_lib(lib, x, requires_grad) for x in t)
    return to_lib(lib, t, requires_grad)


def same(a, b):
    """Same nesting (tuple vs tensor) and values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, flow.Tensor), f"expected a tensor, got {type(b).__name__}"
        torch.testing.assert_close(b.to_torch(), a.detach())
        assert tuple(b.shape) == tuple(a.shape)
    else:
        assert type(b) is type(a) and type(a) in (tuple, list) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            same(x, y)


def elementwise(x):
    return x.sin() * x.exp()


def mm(x, w):
    return (x @ w).tanh()


def two_out(x, w):
    return (x @ w).sigmoid(), (x * x).sum(1)


def scalar(x):
    return (x.sin() * x.cos() * x * x).sum()


def scalar2(x, w):
    return ((x @ w) ** 2).sum() + (x.exp() * 0.5).sum()


def both(name, func, inputs, v=None, **kw):
    """``name`` of torch's and holoflow's functional on the same function and values."""
    outs = []
    for lib, mod in ((torch, TF), (flow, HF)):
        args = (func, conv(lib, inputs)) if v is None else (func, conv(lib, inputs), conv(lib, v))
        outs.append(getattr(mod, name)(*args, **kw))
    same(*outs)
    return outs


@pytest.mark.parametrize("func,inputs,v", [
    (elementwise, X, X * 0.5),
    (mm, (X, W), torch.ones(2, 4, dtype=torch.float64)),
    (two_out, (X, W), (torch.ones(2, 4, dtype=torch.float64), torch.arange(2.0, dtype=torch.float64))),
    (scalar, X, None),
])
def test_vjp(func, inputs, v):
    if v is None:
        both("vjp", lambda x: func(x).reshape(1), inputs)
    both("vjp", func, inputs, v)


@pytest.mark.parametrize("func,inputs,v", [
    (elementwise, X, X * 0.5),
    (mm, (X, W), (X.cos(), W.sin())),
    (two_out, (X, W), (X, W * 2)),
])
def test_jvp(func, inputs, v):
    both("jvp", func, inputs, v)


def test_jvp_and_vjp_without_v_for_one_element():
    x = torch.tensor([0.7], dtype=torch.float64)
    both("jvp", lambda t: (t * 3).exp(), x)
    both("vjp", lambda t: (t * 3).exp(), x)


@pytest.mark.parametrize("kw", [{}, {"vectorize": True}, {"vectorize": True, "strategy": "forward-mode"}])
@pytest.mark.parametrize("func,inputs", [(elementwise, X), (mm, (X, W)), (two_out, (X, W)),
                                         (lambda x: (x.sin(), x.sum()), X), (scalar2, (X, W))])
def test_jacobian(func, inputs, kw):
    both("jacobian", func, inputs, **kw)


def test_jacobian_unused_input_is_zero_unless_strict():
    f = lambda x, w: x.sin()
    both("jacobian", f, (X, W))
    for mod, lib in ((TF, torch), (HF, flow)):
        with pytest.raises(RuntimeError, match="independent of input 1"):
            mod.jacobian(f, (to_lib(lib, X), to_lib(lib, W)), strict=True)


@pytest.mark.parametrize("func,inputs", [(scalar, X), (scalar2, (X, W)), (lambda s: (s ** 3).prod(), S)])
def test_hessian(func, inputs):
    both("hessian", func, inputs)
    both("hessian", func, inputs, vectorize=True)


@pytest.mark.parametrize("name", ["vhp", "hvp"])
@pytest.mark.parametrize("func,inputs,v", [(scalar, X, X.cos()), (scalar2, (X, W), (X, W.exp()))])
def test_vhp_hvp(name, func, inputs, v):
    both(name, func, inputs, v)


@pytest.mark.parametrize("name,func,inputs,v", [
    ("vjp", mm, (X, W), torch.ones(2, 4, dtype=torch.float64)),
    ("jvp", mm, (X, W), (X.cos(), W.sin())),
    ("jacobian", mm, (X, W), None),
    ("hessian", scalar2, (X, W), None),
    ("vhp", scalar2, (X, W), (X, W.exp())),
    ("hvp", scalar2, (X, W), (X, W.exp())),
])
def test_create_graph_then_backward(name, func, inputs, v):
    """The results stay differentiable with respect to the caller's inputs."""
    grads = []
    for lib, mod in ((torch, TF), (flow, HF)):
        ins = conv(lib, inputs, True)
        args = (func, ins) if v is None else (func, ins, conv(lib, v))
        res = getattr(mod, name)(*args, create_graph=True)
        leaves = []
        stack = [res]
        while stack:
            r = stack.pop()
            if isinstance(r, tuple):
                stack.extend(r)
            else:
                leaves.append(r)
        total = sum((r * r).sum() for r in leaves if r.requires_grad)
        grads.append(lib.autograd.grad(total, ins, allow_unused=True, materialize_grads=True))
    same(*grads)


def test_without_create_graph_results_are_detached():
    x = to_lib(flow, X, True)
    out, g = HF.vjp(elementwise, x, to_lib(flow, X))
    assert not out.requires_grad and not g.requires_grad
    assert not HF.jacobian(elementwise, x).requires_grad


@pytest.mark.parametrize("call,msg", [
    (lambda m, lib: m.vjp(lambda x: x.sin(), to_lib(lib, X)), "v can only be None"),
    (lambda m, lib: m.vjp(lambda x: x.sin(), to_lib(lib, X), to_lib(lib, W)), "v has invalid size"),
    (lambda m, lib: m.jvp(lambda x, w: x, (to_lib(lib, X), to_lib(lib, W)), (to_lib(lib, X),)),
     "v is a tuple of invalid length"),
    (lambda m, lib: m.vjp(lambda x: x * 0 + 1, to_lib(lib, X), to_lib(lib, X), strict=True), None),
    (lambda m, lib: m.vjp(lambda x: to_lib(lib, X), to_lib(lib, X), to_lib(lib, X), strict=True),
     "does not require gradients"),
    (lambda m, lib: m.jvp(lambda x: x * 2, to_lib(lib, X), to_lib(lib, X), strict=True), None),
    (lambda m, lib: m.jacobian(lambda x, w: x * 2, (to_lib(lib, X), to_lib(lib, W)), strict=True),
     "Output 0 of the user-provided function is independent of input 1"),
    (lambda m, lib: m.hessian(lambda x: (x * 2).sum(), to_lib(lib, X), strict=True),
     "jacobian of the user-provided function with respect to input 0 is independent"),
    (lambda m, lib: m.hessian(lambda x: x.sin(), to_lib(lib, X)), "single element"),
    (lambda m, lib: m.hvp(lambda x: (x, x), to_lib(lib, X), to_lib(lib, X)), "single Tensor"),
    (lambda m, lib: m.vhp(lambda x: (x * 2).sum(), to_lib(lib, X), to_lib(lib, X), strict=True),
     "jacobian of the user-provided function with respect to input 0 is independent"),
    (lambda m, lib: m.jacobian(lambda x: x, to_lib(lib, X), strict=True, vectorize=True), "not supported together"),
    (lambda m, lib: m.jacobian(lambda x: x, to_lib(lib, X), strategy="forward-mode"), "vectorize=True"),
])
def test_errors_match_torch(call, msg):
    """The same exception class (and message) as torch, or no error where torch raises none."""
    try:
        call(TF, torch)
    except Exception as e:
        cls = type(e)
        assert msg is None or msg in str(e)
        with pytest.raises(cls, match=msg):
            call(HF, flow)
    else:
        assert msg is None
        call(HF, flow)


def test_inputs_must_be_tensors():
    with pytest.raises(TypeError, match="must be either a Tensor or a tuple of Tensors"):
        HF.vjp(elementwise, 3.0, 1.0)
    with pytest.raises(TypeError, match="value at index 1"):
        HF.jacobian(mm, (to_lib(flow, X), [1.0]))


def test_mock_torch_resolves_the_submodule():
    from holoflow import mock_torch
    with mock_torch.enable():
        import torch as mocked
        import torch.autograd.functional as F
        assert F.jacobian is HF.jacobian
        assert mocked.autograd.functional.hessian is HF.hessian


def test_hessian_through_fused_layer_norm():
    """hessian reaches the fused norm's double backward."""
    def f(lib):
        F = torch.nn.functional if lib is torch else flow.nn.functional
        return lambda x: (F.layer_norm(x, (3,)) * x.cos()).sum()
    res = [mod.hessian(f(lib), to_lib(lib, X)) for lib, mod in ((torch, TF), (flow, HF))]
    same(*res)
