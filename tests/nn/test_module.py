"""nn.Module infrastructure: registration, traversal, state dicts, hooks, conversion, copies."""
import copy
import pickle
from collections import OrderedDict

import pytest
import torch

import holoflow as flow
from holoflow import nn


def _net_class(lib, tlib):
    class Net(lib.Module):
        def __init__(self):
            super().__init__()
            self.emb = lib.Embedding(10, 4)
            self.body = lib.Sequential(lib.Linear(4, 8), lib.ReLU(), lib.Linear(8, 4))
            self.norm = lib.LayerNorm(4)
            self.head = lib.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight  # tied
            self.register_buffer("scale", tlib.ones(1))
            self.register_buffer("cache", tlib.zeros(2), persistent=False)
    return Net


_FNet, _TNet = _net_class(nn, flow), _net_class(torch.nn, torch)


def Net(lib=nn):
    return _FNet() if lib is nn else _TNet()


def test_parameter_shares_storage_and_repr():
    t = flow.randn(2, 3)
    p = nn.Parameter(t)
    assert isinstance(p, flow.Tensor) and p.requires_grad and p.is_leaf
    assert p._data.data_ptr() == t._data.data_ptr()
    tp = torch.nn.Parameter(t.to_torch())
    assert repr(p) == repr(tp)
    assert nn.Parameter(t, requires_grad=False).requires_grad is False
    assert tuple(nn.Parameter().shape) == (0,)


def test_setattr_registers_and_unregisters():
    m = nn.Module()
    m.w = nn.Parameter(flow.ones(2))
    m.sub = nn.Linear(2, 2)
    m.register_buffer("b", flow.zeros(1))
    m.plain = 3
    assert list(m._parameters) == ["w"] and list(m._modules) == ["sub"] and list(m._buffers) == ["b"]
    assert "w" not in m.__dict__ and m.plain == 3
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'w'"):
        m.w = flow.ones(2)
    m.w = None
    assert m._parameters["w"] is None and m.w is None
    m.b = flow.ones(3)
    assert tuple(m._buffers["b"].shape) == (3,)
    del m.sub
    assert "sub" not in m._modules
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'nope'"):
        _ = m.nope
    with pytest.raises(KeyError, match="attribute 'plain' already exists"):
        m.register_buffer("plain", flow.zeros(1))
    with pytest.raises(KeyError, match=r'contain "\.", got: a.b'):
        m.register_parameter("a.b", None)
    m.nb = nn.Buffer(flow.zeros(2), persistent=False)
    assert "nb" in m._buffers and "nb" in m._non_persistent_buffers_set
    assert type(m._buffers["nb"]) is flow.Tensor
    assert "w" in dir(m) and "sub" not in dir(m)


def test_assign_before_init_fails():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(flow.ones(1))
    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()


def test_named_members_match_torch_and_dedup_tied():
    torch.manual_seed(0)
    fm, tm = Net(), Net(torch.nn)
    assert [n for n, _ in fm.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert [n for n, _ in fm.named_parameters(remove_duplicate=False)] == \
        [n for n, _ in tm.named_parameters(remove_duplicate=False)]
    assert [n for n, _ in fm.named_buffers()] == [n for n, _ in tm.named_buffers()]
    assert [n for n, _ in fm.named_modules()] == [n for n, _ in tm.named_modules()]
    assert [n for n, _ in fm.named_children()] == [n for n, _ in tm.named_children()]
    assert [n for n, _ in fm.named_parameters(prefix="m", recurse=False)] == []
    assert [n for n, _ in fm.body.named_parameters(prefix="body")] == ["body.0.weight", "body.0.bias",
                                                                      "body.2.weight", "body.2.bias"]
    assert len(list(fm.parameters())) == len(list(tm.parameters())) == 7
    assert fm.head.weight is fm.emb.weight
    assert list(fm.state_dict().keys()) == list(tm.state_dict().keys())
    assert len(list(fm.modules())) == len(list(tm.modules()))


def test_state_dict_round_trip_with_torch():
    torch.manual_seed(0)
    tm = Net(torch.nn)
    fm = Net()
    res = fm.load_state_dict(tm.state_dict())  # torch tensors load directly
    assert repr(res) == "<All keys matched successfully>"
    sd = fm.state_dict()
    assert isinstance(sd, OrderedDict)
    tm2 = Net(torch.nn)
    tm2.load_state_dict({k: v.to_torch() for k, v in sd.items()})
    for k, v in tm.state_dict().items():
        torch.testing.assert_close(tm2.state_dict()[k], v)
    assert not sd["emb.weight"].requires_grad and sd["emb.weight"].grad_fn is None
    assert fm.state_dict(keep_vars=True)["emb.weight"] is fm.emb.weight
    sd["body.0.bias"]._data.add_(1)  # detached but shares storage, as torch
    torch.testing.assert_close(fm.body[0].bias.to_torch(), tm.body[0].bias.detach() + 1)
    assert list(fm.state_dict(prefix="x.")) == list(tm.state_dict(prefix="x.")) and "x.scale" in sd_keys(fm)


def sd_keys(m):
    return ["x." + k for k in m.state_dict()]


def test_load_state_dict_strict_errors_like_torch():
    fm, tm = nn.Linear(2, 3), torch.nn.Linear(2, 3)
    bad = {"weight": torch.zeros(3, 2), "extra": torch.zeros(1)}
    with pytest.raises(RuntimeError) as fe:
        fm.load_state_dict(bad)
    with pytest.raises(RuntimeError) as te:
        tm.load_state_dict(bad)
    assert str(fe.value) == str(te.value)
    res_f, res_t = fm.load_state_dict(bad, strict=False), tm.load_state_dict(bad, strict=False)
    assert res_f.missing_keys == res_t.missing_keys == ["bias"]
    assert res_f.unexpected_keys == res_t.unexpected_keys == ["extra"]
    assert repr(res_f) == repr(res_t)
    shape_bad = {"weight": torch.zeros(2, 2), "bias": torch.zeros(3)}
    for strict in (True, False):
        with pytest.raises(RuntimeError) as fe:
            fm.load_state_dict(shape_bad, strict=strict)
        with pytest.raises(RuntimeError) as te:
            tm.load_state_dict(shape_bad, strict=strict)
        assert str(fe.value) == str(te.value)
        assert "size mismatch for weight: copying a param with shape torch.Size([2, 2])" in str(fe.value)


def test_load_state_dict_nested_errors_and_assign():
    torch.manual_seed(0)
    fm, tm = Net(), Net(torch.nn)
    sd = tm.state_dict()
    del sd["norm.bias"]
    sd["body.5.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError) as fe:
        fm.load_state_dict(sd)
    with pytest.raises(RuntimeError) as te:
        tm.load_state_dict(sd)
    assert str(fe.value) == str(te.value)
    p = fm.norm.weight
    new = {"weight": flow.full((4,), 2.0), "bias": flow.zeros(4)}
    fm.norm.load_state_dict(new, assign=True)
    assert fm.norm.weight is not p and isinstance(fm.norm.weight, nn.Parameter)
    assert fm.norm.weight._data.data_ptr() == new["weight"]._data.data_ptr()


def test_batchnorm_loads_old_checkpoint_without_counter():
    bn = nn.BatchNorm1d(3)
    sd = OrderedDict((k, v) for k, v in torch.nn.BatchNorm1d(3).state_dict().items() if k != "num_batches_tracked")
    sd._metadata = {"": {"version": 1}}
    assert bn.load_state_dict(sd).missing_keys == []


def test_train_eval_apply_requires_grad_zero_grad():
    m = Net()
    assert m.training and m.body[0].training
    m.eval()
    assert not m.training and not m.body[1].training
    m.train()
    assert m.body[2].training
    seen = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    assert seen[-1] == "Net" and seen[0] == "Embedding"
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())
    m.requires_grad_(True)
    out = m.head(m.norm(m.body(m.emb(flow.tensor([1, 2])))))
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad(set_to_none=False)
    assert all(float(p.grad.abs().sum()) == 0 for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_to_keeps_parameter_identity():
    m = Net()
    w = m.body[0].weight
    m.body[0].weight.grad = flow.ones(8, 4)
    assert m.double() is m
    assert m.body[0].weight is w and w.dtype == flow.float64 and w.grad.dtype == flow.float64
    assert m.scale.dtype == flow.float64
    m.to(flow.float32)
    assert w.dtype == flow.float32 and m.head.weight is m.emb.weight
    m.to("cpu", dtype=torch.float16)
    assert w.dtype == flow.float16
    m.bfloat16()
    assert w.dtype == flow.bfloat16
    m.float().cpu()
    assert w.dtype == flow.float32 and w.device == flow.device("cpu")
    bn = nn.BatchNorm1d(2).double()
    assert bn.num_batches_tracked.dtype == flow.int64 and bn.running_mean.dtype == flow.float64
    with pytest.raises(TypeError, match="only accepts floating point"):
        m.to(flow.int32)


def test_get_submodule_parameter_buffer():
    m = Net()
    assert m.get_submodule("body.2") is m.body[2]
    assert m.get_submodule("") is m
    assert m.get_parameter("body.0.bias") is m.body[0].bias
    assert m.get_buffer("scale") is m.scale
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        m.get_submodule("body.nope")
    with pytest.raises(AttributeError, match="is not an nn.Parameter"):
        m.get_parameter("scale")


def test_forward_hooks():
    m = nn.Linear(2, 2)
    calls = []
    h1 = m.register_forward_pre_hook(lambda mod, args: calls.append("pre") or (args[0] * 0,))
    h2 = m.register_forward_hook(lambda mod, args, out: calls.append("post") or out + 1)
    h3 = m.register_forward_hook(lambda mod, args, out: calls.append("first"), prepend=True)
    y = m(flow.ones(1, 2))
    assert calls == ["pre", "first", "post"]
    torch.testing.assert_close(y.detach().to_torch(), m.bias.detach().to_torch().reshape(1, 2) + 1)
    for h in (h1, h2, h3):
        h.remove()
    calls.clear()
    m(flow.ones(1, 2))
    assert calls == []


def test_forward_hooks_with_kwargs():
    class K(nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale
    m = K()
    m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"scale": 3.0}), with_kwargs=True)
    seen = {}
    m.register_forward_hook(lambda mod, args, kwargs, out: seen.update(kwargs), with_kwargs=True)
    assert float(m(flow.ones(1))) == 3.0 and seen == {"scale": 3.0}
    with m.register_forward_hook(lambda *a: flow.zeros(1)):
        assert float(m(flow.ones(1))) == 0.0
    assert float(m(flow.ones(1))) == 3.0


def test_full_backward_hook_matches_torch():
    def run(lib, mk):
        torch.manual_seed(0)
        m = lib.Linear(3, 2)
        got = []
        m.register_full_backward_hook(lambda mod, gi, go: got.append((gi, go)) or (gi[0] * 2,))
        x = mk(torch.randn(4, 3))
        m(x).sum().backward()
        return x.grad, got
    xt, tgot = run(torch.nn, lambda t: t.requires_grad_())
    xf, fgot = run(nn, lambda t: flow.from_torch(t).requires_grad_())
    torch.testing.assert_close(xf.to_torch(), xt)
    torch.testing.assert_close(fgot[0][0][0].to_torch(), tgot[0][0][0])
    torch.testing.assert_close(fgot[0][1][0].to_torch(), tgot[0][1][0])


def test_missing_forward():
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        nn.Module()(1)


def test_deepcopy_and_pickle_keep_ties():
    m = Net()
    c = copy.deepcopy(m)
    assert c.head.weight is c.emb.weight and c.emb.weight is not m.emb.weight
    assert isinstance(c.emb.weight, nn.Parameter) and c.emb.weight.requires_grad
    torch.testing.assert_close(c.emb.weight.to_torch(), m.emb.weight.to_torch())
    s = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5))
    s[1].weight = s[0].weight
    p = pickle.loads(pickle.dumps(s))
    assert p[1].weight is p[0].weight and isinstance(p[1].bias, nn.Parameter) and p[1].bias.requires_grad
    assert list(p.state_dict()) == list(s.state_dict())
    torch.testing.assert_close(p[0].weight.to_torch(), s[0].weight.to_torch())


def test_deepcopy_of_a_parameter_drops_its_grad_as_torch():
    """(holoflow copied ``.grad``: a deep-copied model's first backward then added to the
    original's stale gradients, where torch's copy starts with none); a plain tensor keeps it."""
    for lib in (torch, flow):
        model = lib.nn.Linear(3, 2)
        model(lib.ones(4, 3)).sum().backward()
        t = lib.ones(2, requires_grad=True)
        (t * 3).sum().backward()
        copy_ = copy.deepcopy(model)
        assert all(p.grad is None for p in copy_.parameters())
        assert model.weight.grad is not None and copy.deepcopy(t).grad.tolist() == [3.0, 3.0]
        copy_(lib.ones(4, 3)).sum().backward()
        assert copy_.bias.grad.tolist() == [4.0, 4.0]


def test_state_dict_hooks_and_extra_state():
    class E(nn.Module):
        def __init__(self):
            super().__init__()
            self.v = 0

        def get_extra_state(self):
            return {"v": self.v}

        def set_extra_state(self, s):
            self.v = s["v"]
    e = E()
    e.v = 5
    sd = e.state_dict()
    assert sd["_extra_state"] == {"v": 5}
    e2 = E()
    e2.load_state_dict(sd)
    assert e2.v == 5


def test_to_empty_materializes_a_meta_model_like_torch():
    """Built on the meta device, moved with to_empty, then initialized: the same parameters as
    torch's (reset_parameters draws from the same RNG)."""
    out = []
    for lib in (torch, flow):
        lib.manual_seed(0)
        net = lib.nn.Sequential(lib.nn.Linear(3, 4, device="meta"), lib.nn.BatchNorm1d(4, device="meta"))
        assert net.to_empty(device="cpu") is net
        assert net[0].weight.device.type == "cpu" and net[1].running_mean.device.type == "cpu"
        lib.manual_seed(1)
        for m in net:
            m.reset_parameters()
        out.append([t.detach().numpy().copy() for t in net.state_dict().values()])
    for t, f in zip(*out):
        assert (t == f).all()
    with pytest.raises(TypeError):
        flow.nn.Linear(2, 2).to_empty("cpu")
