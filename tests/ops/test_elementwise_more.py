"""More elementwise ops vs torch: inverse hyperbolics and torch's aliases, deg2rad/rad2deg, erfc,
logit (eps), sgn/signbit, the inf/real predicates, logaddexp2, lcm, bit shifts, igamma/igammac, the
Tensor methods fmax/fmin/hardshrink, and every in-place variant written through a view (with and
without autograd), on simulated ranks too (ops/elementwise.py, ops/methods.py)."""
import math

import numpy as np
import pytest
import torch

import holoflow as flow
from harness import BF16, F32, F64, Case, error_like_torch, parametrize, positive, randn
from holoflow.distributed import world
from holoflow.sbp import B, P, S

INF, NAN = math.inf, math.nan


def _uniform(lo: float, hi: float):
    """Inputs drawn uniformly from (lo, hi): an op's smooth domain."""
    def make(*shape, gen=None, dtype=F32):
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    return make


UNIT, ABOVE_ONE, PROB = _uniform(-0.9, 0.9), _uniform(1.1, 4.0), _uniform(0.05, 0.95)
INTS = torch.tensor([-7, -3, 0, 1, 2, 5, 12])


def _values(*vals):
    """A fixed input of edge values, in the case's dtype."""
    return lambda dt, g: ((torch.tensor(vals, dtype=dt),), {})


def _call(lib, name: str, **kw):
    return lambda *a: getattr(lib, name)(*a, **kw)


def _pair(case: str, make, dtypes=(F32, F64), **flags) -> Case:
    """``holoflow.<name>`` vs ``torch.<name>`` on the inputs ``make`` gives (``case`` is
    ``<name>`` or ``<name>-<what>``)."""
    name = case.split("-")[0]
    return Case(case, _call(flow, name), _call(torch, name), make, dtypes=dtypes, **flags)


# -- unary ops, their aliases, and integer inputs ----------------------------------------------------
SMOOTH = {"acosh": ABOVE_ONE, "asinh": randn, "atanh": UNIT, "erfc": randn, "deg2rad": randn, "rad2deg": randn,
          "logit": PROB, "arccosh": ABOVE_ONE, "arcsinh": randn, "arctanh": UNIT, "arccos": UNIT, "arcsin": UNIT,
          "arctan": randn}
# edge values (``sbp=False``): an infinite or NaN gradient can't be split into partial sums that add
# back up (inf - inf); the smooth cases validate these ops' signatures
CASES = [
    Case(f"{name}{list(shape)}", _call(flow, name), _call(torch, name),
         lambda dt, g, s=shape, d=dom: ((d(*s, gen=g, dtype=dt),), {}), dtypes=(F32, F64, BF16))
    for name, dom in SMOOTH.items() for shape in [(3, 4), (0, 3), ()]
]
CASES += [_pair(f"{name}-int", lambda dt, g: ((INTS.clone(),), {}), grad=False, dtypes=(F32,))
          for name in ("acosh", "asinh", "atanh", "erfc", "deg2rad", "rad2deg", "logit", "sgn", "signbit",
                       "isneginf", "isposinf", "isreal", "fix", "positive")]
CASES += [
    _pair("deg2rad-int32", lambda dt, g: ((INTS.int(),), {}), grad=False, dtypes=(F32,)),
    _pair("rad2deg-bool", lambda dt, g: ((INTS > 0,), {}), grad=False, dtypes=(F32,)),
    _pair("atanh-edges", _values(-1.0, 1.0, 0.5, -0.999, 1.5, -2.0), gradcheck=False, sbp=False),
    _pair("acosh-edges", _values(1.0, 0.5, 1.0001, INF), gradcheck=False, sbp=False),
    _pair("erfc-tails", _values(-INF, -6.0, 0.0, 6.0, 30.0, INF), gradcheck=False, sbp=False),
    _pair("logit-edges", _values(0.0, 1.0, -0.2, 1.3, 0.5, 1e-7), gradcheck=False, sbp=False),
    Case("logit-eps", lambda x: flow.logit(x, 0.2), lambda x: torch.logit(x, 0.2),
         lambda dt, g: ((torch.tensor([0.0, 0.1, 0.25, 0.5, 0.7, 0.9, 1.0, 1.3, -0.2], dtype=dt),), {}),
         gradcheck=False, sbp=False),
    Case("logit-eps-smooth", lambda x: flow.logit(x, eps=1e-3), lambda x: torch.logit(x, eps=1e-3),
         lambda dt, g: ((PROB(4, 5, gen=g, dtype=dt),), {})),
    Case("logit-eps-negative", lambda x: flow.logit(x, -0.5), lambda x: torch.logit(x, -0.5),
         _values(0.0, 0.3, 1.0, 1.2), gradcheck=False, sbp=False),
    Case("logit-method", lambda x: x.logit(0.1), lambda x: x.logit(0.1), lambda dt, g: ((PROB(5, gen=g, dtype=dt),), {})),
    _pair("sgn", lambda dt, g: ((torch.cat([randn(5, gen=g, dtype=dt), torch.zeros(1, dtype=dt)]),), {}),
          gradcheck=False),
    _pair("sgn-complex", lambda dt, g: ((torch.tensor([1 + 2j, 0j, -3 + 0j, -1j]),), {}), grad=False, dtypes=(F32,)),
    _pair("signbit", _values(-0.0, 0.0, -1.5, 2.0, NAN, -NAN, INF, -INF), grad=False, dtypes=(F32, F64, BF16)),
    _pair("isneginf", _values(-INF, INF, NAN, -1.0, 0.0), grad=False, dtypes=(F32, F64, BF16)),
    _pair("isposinf", _values(-INF, INF, NAN, 1.0, 0.0), grad=False, dtypes=(F32, F64, BF16)),
    _pair("isreal", _values(1.0, NAN, INF), grad=False),
    _pair("isreal-complex", lambda dt, g: ((torch.tensor([1 + 0j, 1j, 0j, complex(NAN, 0)]),), {}), grad=False,
          dtypes=(F32,)),
    _pair("acosh-complex", lambda dt, g: ((torch.tensor([0.5 + 1j, -2 + 0j, 3 - 1j]),), {}), grad=False, dtypes=(F32,)),
    _pair("fix", lambda dt, g: ((randn(4, 3, gen=g, dtype=dt) * 3,), {}), gradcheck=False),
    Case("positive", lambda x: flow.positive(x) * 2, lambda x: torch.positive(x) * 2,
         lambda dt, g: ((randn(3, gen=g, dtype=dt),), {})),
    Case("hardshrink-method", lambda x: x.hardshrink(0.6), lambda x: x.hardshrink(0.6),
         lambda dt, g: ((randn(4, 5, gen=g, dtype=dt),), {}), gradcheck=False),
    Case("fmax-fmin-methods", lambda a, b: (a.fmax(b), a.fmin(b)), lambda a, b: (a.fmax(b), a.fmin(b)),
         lambda dt, g: ((torch.tensor([1.0, NAN, 3.0, NAN], dtype=dt), torch.tensor([2.0, 0.5, NAN, NAN], dtype=dt)),
                        {}), gradcheck=False),
]

# -- binary ops ------------------------------------------------------------------------------------------
SHAPES = [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((4,), ()), ((0, 2), (2,))]
CASES += [
    Case(f"logaddexp2{list(sa)}{list(sb)}", flow.logaddexp2, torch.logaddexp2,
         lambda dt, g, sa=sa, sb=sb: ((randn(*sa, gen=g, dtype=dt) * 3, randn(*sb, gen=g, dtype=dt)), {}),
         dtypes=(F32, F64, BF16))
    for sa, sb in SHAPES
]
CASES += [
    _pair("logaddexp2-infs", lambda dt, g: ((torch.tensor([-INF, INF, -INF, 0.0, 1e4], dtype=dt),
                                             torch.tensor([-INF, INF, 1.0, -INF, -1e4], dtype=dt)), {}),
          gradcheck=False),
    _pair("logaddexp2-int-promotes", lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), INTS[:4].clone()), {})),
    _pair("lcm", lambda dt, g: ((torch.tensor([4, -6, 0, 0, -3, 7, 12]), torch.tensor([6, 4, 5, 0, -7, 7, -18])), {}),
          grad=False, dtypes=(F32,)),
    _pair("lcm-broadcast-int32", lambda dt, g: ((INTS.int().reshape(7, 1), torch.tensor([3, -4, 0, 6])), {}),
          grad=False, dtypes=(F32,)),
    Case("lcm-method", lambda a, b: a.lcm(b), lambda a, b: a.lcm(b),
         lambda dt, g: ((INTS.to(torch.int16), torch.tensor(6, dtype=torch.int16)), {}), grad=False, dtypes=(F32,)),
]
SHIFTS = {
    "int64": (INTS.clone(), torch.tensor([0, 1, 2, 63, 64, 65, 3])),
    "int8": (torch.tensor([1, -1, 100, -128, 5, 7], dtype=torch.int8), torch.tensor([0, 7, 8, 9, 1, 2], dtype=torch.int8)),
    "uint8": (torch.tensor([1, 255, 128, 3], dtype=torch.uint8), torch.tensor([1, 1, 8, 0], dtype=torch.uint8)),
    "int32-negative-amount": (INTS[:3].int(), torch.tensor([-1, -2, 1], dtype=torch.int32)),
    "broadcast": (INTS.reshape(7, 1), torch.tensor([0, 1, 5])),
}
for _name in ("bitwise_left_shift", "bitwise_right_shift"):
    CASES += [_pair(f"{_name}-{k}", lambda dt, g, a=a, b=b: ((a, b), {}), grad=False, dtypes=(F32,))
              for k, (a, b) in SHIFTS.items()]
    CASES += [
        Case(f"{_name}-scalar-other", lambda a, n=_name: getattr(flow, n)(a, 3),
             lambda a, n=_name: getattr(torch, n)(a, 3), lambda dt, g: ((INTS.to(torch.int16),), {}), grad=False,
             dtypes=(F32,)),
        Case(f"{_name}-scalar-input", lambda a, n=_name: getattr(flow, n)(40, a),
             lambda a, n=_name: getattr(torch, n)(40, a), lambda dt, g: ((torch.tensor([0, 1, 3], dtype=torch.int8),), {}),
             grad=False, dtypes=(F32,)),
    ]
CASES += [
    Case("shift-operators", lambda a, b: (a << b, a >> b, a << 2, a >> 1, 3 << b, 64 >> b),
         lambda a, b: (a << b, a >> b, a << 2, a >> 1, 3 << b, 64 >> b),
         lambda dt, g: ((INTS.clone(), torch.tensor([1, 2, 0, 3, 1, 2, 4])), {}), grad=False, dtypes=(F32,)),
]


def _gamma_args(sa, sb):
    return lambda dt, g: ((positive(*sa, gen=g, dtype=dt) * 3, positive(*sb, gen=g, dtype=dt) * 2), {})


for _name in ("igamma", "igammac"):
    # torch has no derivative in ``input``: it is detached, the gradient flows to ``other`` (no
    # gradcheck: it perturbs the detached input too; the comparison with torch checks the gradient)
    CASES += [Case(f"{_name}{list(sa)}{list(sb)}", lambda a, x, n=_name: getattr(flow, n)(a.detach(), x),
                   lambda a, x, n=_name: getattr(torch, n)(a.detach(), x), _gamma_args(sa, sb), gradcheck=False)
              for sa, sb in [((3, 4), (3, 4)), ((3, 1), (4,)), ((0, 2), (2,))]]
    CASES += [
        _pair(f"{_name}-edges", lambda dt, g: ((torch.tensor([0.5, 1.0, 2.0, 3.0, 1.0, 2.0], dtype=dt),
                                                torch.tensor([0.0, 0.0, 0.0, INF, 1e-3, 40.0], dtype=dt)), {}),
              grad=False),
        _pair(f"{_name}-promotes", lambda dt, g: ((positive(3, gen=g, dtype=F64), positive(3, gen=g, dtype=dt)), {}),
              grad=False),
        Case(f"{_name}-method", lambda a, x, n=_name: getattr(a.detach(), n)(x),
             lambda a, x, n=_name: getattr(a.detach(), n)(x), _gamma_args((4,), (4,)), gradcheck=False),
    ]


# -- in-place variants, written through a view (x[1:] of a (3, 4) input) --------------------------------
def _write_view(name: str, detach: bool = False):
    """``y = x * 1; y[1:].<name>(*rest, **kw); return y`` for either library: the write reaches
    ``y`` and, under autograd, the gradient reaches ``x`` (``detach``: only the other arguments)."""
    def fn(x, *rest, **kw):
        y = (x.detach() if detach else x) * 1
        view = y[1:]
        assert getattr(view, name)(*rest, **kw) is view
        return y
    return fn


#: in-place method[-variant] -> (input domain, makers of the other (4,)-shaped arguments, keywords;
#: "lo"/"hi" stand for a tensor bound drawn per case)
INPLACE = {
    "acosh_": (ABOVE_ONE, (), {}), "asinh_": (randn, (), {}), "atanh_": (UNIT, (), {}),
    "arccos_": (UNIT, (), {}), "arcsin_": (UNIT, (), {}), "arctan_": (randn, (), {}),
    "arccosh_": (ABOVE_ONE, (), {}), "arcsinh_": (randn, (), {}), "arctanh_": (UNIT, (), {}),
    "deg2rad_": (randn, (), {}), "rad2deg_": (randn, (), {}), "erfc_": (randn, (), {}),
    "logit_": (PROB, (), {}), "logit_-eps": (PROB, (), {"eps": 0.2}),
    "sgn_": (randn, (), {}), "fix_": (randn, (), {}), "absolute_": (randn, (), {}), "negative_": (randn, (), {}),
    "arctan2_": (randn, (randn,), {}), "divide_": (randn, (positive,), {}),
    "divide_-floor": (randn, (positive,), {"rounding_mode": "floor"}), "true_divide_": (randn, (positive,), {}),
    "multiply_": (randn, (randn,), {}), "subtract_": (randn, (randn,), {"alpha": 2.5}),
    "floor_divide_": (randn, (positive,), {}), "float_power_": (positive, (randn,), {}),
    "lerp_": (randn, (randn,), {"weight": 0.3}), "lerp_-tensor-weight": (randn, (randn, positive), {}),
    "xlogy_": (randn, (positive,), {}), "addcmul_": (randn, (randn, randn), {"value": 0.5}),
    "addcdiv_": (randn, (randn, positive), {"value": 2}),
    "clamp_min_": (randn, (), {"min": -0.2}), "clamp_max_": (randn, (), {"max": 0.3}),
    "clamp_min_-tensor": (randn, (randn,), {}), "clamp_max_-tensor": (randn, (randn,), {}),
    "clamp_-tensors": (randn, (), {"min": "lo", "max": "hi"}),
    "igamma_": (positive, (positive,), {}), "igammac_": (positive, (positive,), {}),
    **{n: (randn, (randn,), {}) for n in ("greater_", "greater_equal_", "less_", "less_equal_", "not_equal_")},
}
NOT_DIFFERENTIABLE = {"greater_", "greater_equal_", "less_", "less_equal_", "not_equal_", "floor_divide_",
                      "divide_-floor"}
DETACHED_SELF = {"igamma_", "igammac_"}   # no derivative in ``input``; the gradient flows to ``other``
F64_ONLY = {"float_power_"}               # its base must already be float64 (torch refuses float32)
INT_BASE = torch.tensor([[-7, -3, 0, 1], [2, 5, 12, -4], [9, -6, 3, 8]])
INTEGER_INPLACE = {   # in-place method on an int64 view -> its other argument (or keywords)
    "lcm_": (torch.tensor([4, -6, 0, 9]),), "bitwise_left_shift_": (torch.tensor([1, 0, 3, 62]),),
    "bitwise_right_shift_": (torch.tensor([1, 0, 3, 64]),), "floor_divide_": (torch.tensor([2, -3, 5, 4]),),
    "greater_": (torch.tensor([0, 1, -1, 2]),), "sgn_": (), "fix_": (), "clamp_min_": ({"min": 0},),
}


def _inplace_make(dom, others, kw):
    def make(dt, g):
        kws = {k: positive(4, gen=g, dtype=dt) * (1 if k == "max" else -1) if v in ("lo", "hi") else v
               for k, v in kw.items()}
        return (dom(3, 4, gen=g, dtype=dt), *(o(4, gen=g, dtype=dt) for o in others)), kws
    return make


def _out_of_place_write(name: str):
    """torch's reference where torch has no derivative for the in-place form ("the derivative for
    'inplace version of acosh' is not implemented"): the out-of-place op copied into the view."""
    def fn(x):
        y = x * 1
        y[1:].copy_(getattr(y[1:].clone(), name[:-1])())
        return y
    return fn


#: in-place forms torch can't differentiate (holoflow can: the write keeps a copy of the input)
TORCH_NO_INPLACE_GRAD = {"acosh_", "asinh_", "atanh_", "arccosh_", "arcsinh_", "arctanh_"}


def _inplace_cases(key: str, spec) -> list[Case]:
    dom, others, kw = spec
    name = key.split("-")[0]
    dtypes = (F64,) if name in F64_ONLY else (F32, F64)
    make = _inplace_make(dom, others, kw)
    flow_fn = _write_view(name, detach=name in DETACHED_SELF)
    cases = [Case(f"{key}-view", flow_fn, flow_fn, make, grad=False, dtypes=dtypes)]
    if key not in NOT_DIFFERENTIABLE:
        torch_fn = _out_of_place_write(name) if name in TORCH_NO_INPLACE_GRAD else flow_fn
        cases.append(Case(f"{key}-view-grad", flow_fn, torch_fn, make, dtypes=dtypes,
                          gradcheck=name not in DETACHED_SELF))
    return cases


CASES += [c for key, spec in INPLACE.items() for c in _inplace_cases(key, spec)]
CASES += [Case(f"{name}-int-view", _write_view(name), _write_view(name),
               lambda dt, g, extra=extra: ((INT_BASE.clone(), *(e for e in extra if not isinstance(e, dict))),
                                           next((e for e in extra if isinstance(e, dict)), {})),
               grad=False, dtypes=(F32,))
          for name, extra in INTEGER_INPLACE.items()]

globals().update(parametrize(CASES))


# -- complex gradients (the harness differentiates real tensors only) --------------------------------------
Z = torch.tensor([1 + 2j, -0.5 + 0.1j, 0j, 3 - 1j, 0.2 - 0.7j], dtype=torch.complex64)


@pytest.mark.parametrize("name", ["acosh", "asinh", "atanh", "sgn", "arcsinh"])
def test_complex_gradient_equals_torch(name):
    def grad(lib):
        z = flow.tensor(Z.numpy(), requires_grad=True) if lib is flow else Z.clone().requires_grad_()
        y = getattr(lib, name)(z)
        (lib.view_as_real(y) * lib.tensor([1.0, -0.5])).sum().backward()
        return torch.as_tensor(z.grad.numpy())
    torch.testing.assert_close(grad(flow), grad(torch), rtol=1e-5, atol=1e-5)


# -- aliases, return values, fast path, errors --------------------------------------------------------------
@pytest.mark.parametrize("alias,name", sorted(flow.ops.elementwise._ALIASES.items()))
def test_alias_is_the_same_function_and_method(alias, name):
    assert getattr(flow, alias) is getattr(flow, name)
    assert getattr(flow.Tensor, alias) is getattr(flow.Tensor, name)
    if hasattr(torch.Tensor, alias + "_"):
        assert getattr(flow.Tensor, alias + "_") is getattr(flow.Tensor, name + "_")


def test_every_torch_inplace_method_of_these_ops_exists():
    names = [k.split("-")[0] for k in INPLACE] + list(INTEGER_INPLACE)
    missing = sorted({n for n in names if hasattr(torch.Tensor, n) and not hasattr(flow.Tensor, n)})
    assert not missing


@pytest.mark.parametrize("key", sorted(INPLACE))
def test_inplace_returns_self_and_writes_the_base(key):
    """Without autograd (the in-place kernel's fast path): the method returns its target, a view's
    write reaches the base, and values and dtype are torch's."""
    dom, others, kw = INPLACE[key]
    name = key.split("-")[0]
    dt = F64 if name in F64_ONLY else F32
    args, kws = _inplace_make(dom, others, kw)(dt, torch.Generator().manual_seed(3))
    t = args[0].clone()
    f = flow.from_torch(args[0].clone())
    tv, fv = t[1:], f[1:]
    assert getattr(fv, name)(*map(flow.from_torch, args[1:]), **{k: flow.from_torch(v) if isinstance(v, torch.Tensor)
                                                              else v for k, v in kws.items()}) is fv
    getattr(tv, name)(*args[1:], **kws)
    torch.testing.assert_close(f.to_torch(), t, equal_nan=True)


def test_inplace_dunder_shifts():
    for lib in (torch, flow):
        x = lib.tensor([1, 2, -8])
        x <<= 2
        x >>= 1
        assert x.tolist() == [2, 4, -16]


ERRORS = {
    "acosh_ on int": lambda m: m.tensor([1, 2]).acosh_(),
    "deg2rad complex": lambda m: m.deg2rad(m.tensor([1j])),
    "signbit complex": lambda m: m.signbit(m.tensor([1j])),
    "isposinf complex": lambda m: m.isposinf(m.tensor([1j])),
    "lcm float": lambda m: m.lcm(m.tensor([1.0]), m.tensor([2.0])),
    "lcm scalar": lambda m: m.lcm(m.tensor([4]), 2),
    "shift float": lambda m: m.bitwise_left_shift(m.tensor([1.0]), 1),
    "igamma scalar": lambda m: m.igamma(m.tensor([1.0]), 2.0),
    "igamma scalar input": lambda m: m.igamma(1.0, m.tensor([2.0])),
    "igamma int": lambda m: m.igamma(m.tensor([1]), m.tensor([2])),
    "logaddexp2 scalar": lambda m: m.logaddexp2(m.tensor([1.0]), 2.0),
    "logaddexp2 int": lambda m: m.logaddexp2(m.tensor([1]), m.tensor([2])),
    "logit complex": lambda m: m.logit(m.tensor([1j])),
    "positive bool": lambda m: m.positive(m.tensor([True])),
    "+bool": lambda m: +m.tensor([True]),
    "acosh number": lambda m: m.acosh(3.0),
    "float_power_ float32": lambda m: m.ones(2).float_power_(2),
    "float_power_ complex exponent": lambda m: m.ones(2, dtype=m.float64).float_power_(2j),
    "multiply_ float into int": lambda m: m.tensor([1, 2]).multiply_(1.5),
    "divide_ int": lambda m: m.tensor([1, 2]).divide_(2),
    "xlogy_ int": lambda m: m.tensor([1, 2]).xlogy_(m.tensor([1, 2])),
    "lerp_ broadcast": lambda m: m.zeros(3).lerp_(m.zeros(2, 3), 0.5),
    "addcmul_ broadcast": lambda m: m.zeros(3).addcmul_(m.ones(2, 3), m.ones(3)),
    "addcdiv ints": lambda m: m.addcdiv(m.tensor([1]), m.tensor([1]), m.tensor([2])),
    "addcdiv_ ints": lambda m: m.tensor([1]).addcdiv_(m.tensor([1]), m.tensor([2])),
    "clamp_min_ broadcast": lambda m: m.zeros(3).clamp_min_(m.zeros(2, 3)),
    "clamp_ no bounds": lambda m: m.zeros(3).clamp_(),
    "clamp no bounds": lambda m: m.clamp(m.zeros(3)),
    "logit_ leaf": lambda m: m.ones(2, requires_grad=True).logit_(0.1),
    "lerp_ leaf": lambda m: m.ones(2, requires_grad=True).lerp_(m.zeros(2), 0.5),
}



@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_have_torchs_class(name):
    error_like_torch(ERRORS[name], name)


def test_igamma_has_no_derivative_in_input_as_torch():
    for lib in (torch, flow):
        a = lib.tensor([1.5, 2.0], requires_grad=True)
        x = lib.tensor([0.5, 1.0], requires_grad=True)
        with pytest.raises(NotImplementedError, match="not implemented"):
            lib.igamma(a, x).sum().backward()


# -- global tensors: in-place writes through views on simulated ranks ----------------------------------------
GLOBAL_WRITES = {
    "erfc_": lambda lib, x: x[1:].erfc_(),
    "logit_": lambda lib, x: x[:, 1:3].mul_(0.5).logit_(0.3),
    "lerp_": lambda lib, x: x[1:].lerp_(x[:-1] * 2, 0.25),
    "clamp_min_": lambda lib, x: x[:, 2].clamp_min_(x[:, 0] * 0 + 1.5),
    "float_power_": lambda lib, x: x[::2].float_power_(1.5),
    "arcsin_": lambda lib, x: (x.mul_(0.2))[2].arcsin_(),
}
GW = np.arange(1.0, 21.0).reshape(4, 5) / 21 + 1


def _global_ref(name: str):
    w = torch.tensor(GW, requires_grad=True)
    x = w * 1.0
    GLOBAL_WRITES[name](torch, x)
    (x * x).sum().backward()
    return x.detach().numpy(), w.grad.numpy()


def _global_run(rank: int) -> dict:
    place = flow.placement("cpu", [0, 1])
    out = {}
    for nd in [(B,), (S(0),), (S(1),), (P,)]:
        for name, write in GLOBAL_WRITES.items():
            w = flow.tensor(GW).to_global(placement=place, sbp=B).to_global(sbp=nd).detach().requires_grad_(True)
            x = w * 1.0
            write(flow, x)
            (x * x).sum().backward()
            out[(name, str(nd))] = (x.detach().to_global(sbp=B).to_local().numpy(),
                                    w.grad.to_global(sbp=B).to_local().numpy())
    return out


def test_inplace_writes_through_global_views_on_2_simulated_ranks():
    for res in world.simulate(2, _global_run):
        for (name, nd), (x, grad) in res.items():
            want_x, want_grad = _global_ref(name)
            np.testing.assert_allclose(x, want_x, rtol=1e-6, err_msg=f"{name} {nd}: values")
            np.testing.assert_allclose(grad, want_grad, rtol=1e-5, err_msg=f"{name} {nd}: the leaf's gradient")


def test_equal_is_one_bool_as_torch():
    cases = [(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])), (torch.tensor([1, 2]), torch.tensor([1.0, 2.0])),
             (torch.ones(2), torch.ones(3)), (torch.tensor([float("nan")]), torch.tensor([float("nan")])),
             (torch.zeros(2, 3), torch.zeros(2, 3)), (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5]))]
    for a, b in cases:
        want = torch.equal(a, b)
        got = flow.equal(flow.from_torch(a), flow.from_torch(b))
        assert got is want and flow.from_torch(a).equal(flow.from_torch(b)) is want, (a, b)
    with pytest.raises(TypeError, match="must be a Tensor"):
        flow.equal(flow.ones(2), 1)
