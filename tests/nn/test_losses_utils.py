"""Loss modules, containers, clip_grad_norm_ and weight tying in training, against torch."""
import math
from collections import OrderedDict

import pytest
import torch

import holoflow as flow
from holoflow import nn

from .helpers import to_flow

F32, F64 = torch.float32, torch.float64


def _g():
    return torch.Generator().manual_seed(5)


def _cls(dtype):
    g = _g()
    return [torch.randn(6, 4, generator=g, dtype=dtype), torch.tensor([0, 3, 1, 1, 2, -100])]


def _reg(dtype):
    g = _g()
    return [torch.randn(3, 5, generator=g, dtype=dtype), torch.randn(3, 5, generator=g, dtype=dtype)]


def _prob(dtype):
    g = _g()
    return [torch.rand(3, 5, generator=g, dtype=dtype).clamp(0.05, 0.95),
            torch.rand(3, 5, generator=g, dtype=dtype)]


def _kl(dtype):
    g = _g()
    return [torch.randn(3, 5, generator=g, dtype=dtype).log_softmax(-1),
            torch.randn(3, 5, generator=g, dtype=dtype).softmax(-1)]


LOSSES = {
    "ce": (lambda l, t: l.CrossEntropyLoss(), _cls),
    "ce-weight-smooth": (lambda l, t: l.CrossEntropyLoss(weight=t.tensor([1.0, 2.0, 0.5, 1.0]), label_smoothing=0.1), _cls),
    "ce-sum": (lambda l, t: l.CrossEntropyLoss(reduction="sum", ignore_index=1),
               lambda d: [_cls(d)[0], _cls(d)[1].clamp(min=0)]),
    "nll": (lambda l, t: l.NLLLoss(), lambda d: [_cls(d)[0].log_softmax(-1), _cls(d)[1]]),
    "mse": (lambda l, t: l.MSELoss(), _reg), "mse-none": (lambda l, t: l.MSELoss(reduction="none"), _reg),
    "l1": (lambda l, t: l.L1Loss(), _reg), "smoothl1": (lambda l, t: l.SmoothL1Loss(beta=0.5), _reg),
    "huber": (lambda l, t: l.HuberLoss(delta=0.7), _reg),
    "bce": (lambda l, t: l.BCELoss(), _prob),
    "bcelogits": (lambda l, t: l.BCEWithLogitsLoss(pos_weight=t.tensor([1.0, 2.0, 1.0, 0.5, 3.0])), _prob),
    "kldiv": (lambda l, t: l.KLDivLoss(reduction="batchmean"), _kl),
    "kldiv-logtarget": (lambda l, t: l.KLDivLoss(log_target=True), lambda d: [_kl(d)[0], _kl(d)[1].log()]),
    "legacy-size-average": (lambda l, t: l.MSELoss(size_average=False), _reg),
}


@pytest.mark.parametrize("dtype", [F32, F64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_loss_matches_torch(name, dtype):
    make, inputs = LOSSES[name]
    fm, tm = make(nn, flow), make(torch.nn, torch)
    fm.to(dtype), tm.to(dtype)
    assert list(fm.state_dict()) == list(tm.state_dict()) and fm.reduction == tm.reduction
    xs = inputs(dtype)  # the target is not differentiated here
    f_in, t_in = to_flow(xs[0], True), xs[0].clone().requires_grad_()
    fo, to = fm(f_in, to_flow(xs[1])), tm(t_in, xs[1])
    a, r = (1e-5, 1e-4) if dtype == F32 else (1e-10, 1e-9)
    torch.testing.assert_close(fo.to_torch(), to.detach(), atol=a, rtol=r)
    dy = torch.randn(to.shape, generator=_g(), dtype=dtype)
    to.backward(dy)
    fo.backward(to_flow(dy))
    torch.testing.assert_close(f_in.grad.to_torch(), t_in.grad, atol=a, rtol=r)


def test_sequential_api():
    s = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(s) == 3 and isinstance(s[1], nn.ReLU) and s[-1] is s[2]
    sub = s[1:]
    assert isinstance(sub, nn.Sequential) and len(sub) == 2 and sub[0] is s[1]
    assert list(sub._modules) == ["1", "2"]  # torch keeps the original keys on slicing
    s.append(nn.Sigmoid())
    assert len(s) == 4 and [type(m).__name__ for m in s] == ["Linear", "ReLU", "Linear", "Sigmoid"]
    del s[1]
    assert list(s._modules) == ["0", "1", "2"] and isinstance(s[1], nn.Linear)
    s[2] = nn.Tanh()
    assert isinstance(s[2], nn.Tanh)
    named = nn.Sequential(OrderedDict(fc=nn.Linear(2, 2), act=nn.ReLU()))
    assert named.fc is named[0] and list(named.state_dict()) == ["fc.weight", "fc.bias"]
    with pytest.raises(IndexError, match="index 5 is out of range"):
        s[5]
    y = s(flow.ones(4, 2))
    assert tuple(y.shape) == (4, 1)


def test_module_list_dict_parameter_containers():
    ml = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    ml.append(nn.ReLU())
    ml.extend([nn.Tanh()])
    ml.insert(0, nn.Identity())
    assert len(ml) == 6 and isinstance(ml[0], nn.Identity) and isinstance(ml[-1], nn.Tanh)
    assert [n for n, _ in ml.named_parameters()][:2] == ["1.weight", "1.bias"]
    assert len(ml[1:3]) == 2
    md = nn.ModuleDict({"a": nn.Linear(1, 1)})
    md["b"] = nn.ReLU()
    assert list(md.keys()) == ["a", "b"] and "a" in md and len(md) == 2
    assert md.pop("a") is not None and list(md) == ["b"]
    pl = nn.ParameterList([flow.ones(2), nn.Parameter(flow.zeros(3))])
    pl.append(flow.ones(1))
    assert len(pl) == 3 and all(isinstance(p, nn.Parameter) for p in pl)
    assert [n for n, _ in pl.named_parameters()] == ["0", "1", "2"]
    pd = nn.ParameterDict({"w": flow.ones(2)})
    pd["b"] = flow.zeros(2)
    assert isinstance(pd["w"], nn.Parameter) and list(pd.keys()) == ["w", "b"]
    m = nn.Module()
    m.ps = pd
    assert list(m.state_dict()) == ["ps.w", "ps.b"]
    tm = torch.nn.Module()
    tm.ps = torch.nn.ParameterDict({"w": torch.ones(2)})
    tm.ps["b"] = torch.zeros(2)
    assert list(tm.state_dict()) == list(m.state_dict())
    assert list(nn.ParameterDict({"z": flow.ones(1), "a": flow.ones(1)})) == \
        list(torch.nn.ParameterDict({"z": torch.ones(1), "a": torch.ones(1)})) == ["a", "z"]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.1, 100.0])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(3, 4, generator=g, dtype=F64), torch.randn(5, generator=g, dtype=F64)]
    tps = [torch.nn.Parameter(torch.zeros_like(x)) for x in grads]
    fps = [nn.Parameter(flow.zeros(*x.shape, dtype=flow.float64)) for x in grads]
    for tp, fp, x in zip(tps, fps, grads):
        tp.grad, fp.grad = x.clone(), to_flow(x)
    fps.append(nn.Parameter(flow.zeros(2)))  # a parameter without grad is ignored
    tn = torch.nn.utils.clip_grad_norm_(tps, max_norm, norm_type)
    fn = nn.utils.clip_grad_norm_(fps, max_norm, norm_type)
    torch.testing.assert_close(fn.to_torch(), tn)
    for tp, fp in zip(tps, fps):
        torch.testing.assert_close(fp.grad.to_torch(), tp.grad)


def test_clip_grad_value_and_errors_and_vectors():
    p = nn.Parameter(flow.zeros(4))
    p.grad = flow.tensor([-3.0, 0.5, 2.0, -0.1])
    nn.utils.clip_grad_value_(p, 1.0)
    assert p.grad.tolist() == pytest.approx([-1.0, 0.5, 1.0, -0.1])
    p.grad = flow.tensor([float("nan"), 1.0, 0.0, 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert float(nn.utils.clip_grad_norm_([], 1.0)) == 0.0
    m = nn.Linear(3, 2)
    v = nn.utils.parameters_to_vector(m.parameters())
    assert tuple(v.shape) == (8,)
    nn.utils.vector_to_parameters(v * 0 + 1, m.parameters())
    assert m.weight.tolist() == [[1.0] * 3] * 2 and isinstance(m.weight, nn.Parameter)


def test_weight_tying_trains_like_torch():
    def build(lib):
        emb, head = lib.Embedding(7, 4), lib.Linear(4, 7, bias=False)
        head.weight = emb.weight
        return lib.Sequential(emb, lib.Tanh(), head)
    torch.manual_seed(0)
    tm = build(torch.nn)
    fm = build(nn)
    fm.load_state_dict(tm.state_dict())
    assert len(list(fm.parameters())) == len(list(tm.parameters())) == 1
    idx = torch.tensor([1, 4, 4, 6])
    tm(idx).sum().backward()
    fm(flow.from_torch(idx)).sum().backward()
    torch.testing.assert_close(fm[0].weight.grad.to_torch(), tm[0].weight.grad)
    assert fm[2].weight.grad is fm[0].weight.grad
