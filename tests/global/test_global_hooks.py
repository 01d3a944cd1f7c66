"""Gradient hooks and retain_grad on global tensors see (and may return) the global gradient, as
OneFlow's do: values and the gradients downstream of a hook against torch, under every 1-D SBP,
on simulated ranks and on Gloo."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.core.errors import HoloflowError
from holoflow.distributed import world
from holoflow.sbp import B, P, S

W = np.arange(12.0, dtype=np.float32).reshape(3, 4) / 7
NDS = [(B,), (S(0),), (S(1),)]


def _whole(t) -> np.ndarray:
    return t.to_global(sbp=B).to_local().numpy() if isinstance(t, flow.Tensor) else t.detach().numpy()


def _body(w, respell):
    """A leaf hook, a non-leaf hook that triples (returning the gradient re-spelled by
    ``respell``), retain_grad: what each saw and the gradients that came out."""
    seen = {}
    w.register_hook(lambda g: seen.__setitem__("leaf", _whole(g)))
    x = w * 2
    x.retain_grad()
    x.register_hook(lambda g: seen.__setitem__("x", _whole(g)) or respell(g) * 3)
    ((x * x).sum() + x.sum()).backward()
    return seen["x"], seen["leaf"], _whole(x.grad), _whole(w.grad)


def _torch_ref():
    w = torch.tensor(W, requires_grad=True)
    return _body(w, lambda g: g)


def _run(rank: int) -> dict:
    place = flow.placement("cpu", [0, 1])
    out = {}
    for nd in NDS:
        for name, respell in (("as_given", lambda g: g), ("broadcast", lambda g: g.to_global(sbp=B))):
            w = flow.tensor(W).to_global(placement=place, sbp=B).to_global(sbp=nd).detach().requires_grad_(True)
            out[(nd, name)] = _body(w, respell)
    return out


def _check(results):
    want = _torch_ref()
    for res in results:
        for key, got in res.items():
            for what, g, t in zip(("x hook", "leaf hook", "x.grad", "w.grad"), got, want):
                np.testing.assert_allclose(g, t, rtol=1e-6, err_msg=f"{key}: {what}")


def test_hooks_and_retain_grad_on_simulated_ranks():
    _check(world.simulate(2, _run))


def test_hooks_and_retain_grad_on_gloo(world2):
    _check(world2.run(_run))


def test_the_hook_sees_the_gradient_as_the_global_tensor_it_is():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        sbps = {}
        for nd in NDS:
            w = flow.tensor(W).to_global(placement=place, sbp=B).to_global(sbp=nd).detach().requires_grad_(True)
            x = w * 2
            x.register_hook(lambda g, nd=nd: sbps.__setitem__(nd, (g.is_global, tuple(g.shape), tuple(g.sbp))))
            x.sum().backward()
        return sbps
    for sbps in world.simulate(2, run):
        assert sbps == {(B,): (True, (3, 4), (P,)), (S(0),): (True, (3, 4), (S(0),)),
                        (S(1),): (True, (3, 4), (S(1),))}


def test_a_hook_returning_another_shape_is_an_error():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.tensor(W).to_global(placement=place, sbp=S(0)).detach().requires_grad_(True)
        x = w * 2
        x.register_hook(lambda g: g.sum(dim=0))
        with pytest.raises(HoloflowError, match=r"hook on a global tensor of shape \(6, 4\).*returned a gradient of shape \(4,\)"):
            x.sum().backward()
        return True
    assert all(world.simulate(2, run))
