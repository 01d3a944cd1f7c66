"""torch.nn.init's deprecated spellings without the trailing underscore (uniform, normal, constant,
eye, dirac, xavier_*, kaiming_*, orthogonal, sparse): the same FutureWarning text pointing at the
caller, the same values as torch under one seed, and global tensors initialised as their whole."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, S

# (name, shape, args): every deprecated alias torch 2.13 keeps
OLD = [
    ("uniform", (3, 4), (-0.5, 2.0)), ("normal", (3, 4), (1.0, 0.5)), ("constant", (3, 4), (0.25,)),
    ("eye", (3, 5), ()), ("dirac", (4, 2, 3, 3), (2,)), ("xavier_uniform", (5, 4), (1.5,)),
    ("xavier_normal", (5, 4), ()), ("kaiming_uniform", (6, 3, 2), (0.1,)), ("kaiming_normal", (6, 3), ()),
    ("orthogonal", (4, 6), ()), ("sparse", (6, 4), (0.5,)),
]


def test_every_public_torch_init_name_exists():
    public = [n for n in dir(torch.nn.init) if not n.startswith("_") and callable(getattr(torch.nn.init, n))
              and getattr(getattr(torch.nn.init, n), "__module__", "") == "torch.nn.init"]
    assert sorted(n for n, _, _ in OLD) == sorted(n for n in public if not n.endswith("_") and n + "_" in public)
    assert not [n for n in public if not hasattr(flow.nn.init, n)]
    assert all(n in flow.nn.init.__all__ for n, _, _ in OLD)


@pytest.mark.parametrize("name,shape,args", OLD, ids=[n for n, _, _ in OLD])
def test_deprecated_alias_warns_and_fills_like_torch(name, shape, args):
    out = []
    for lib in (torch, flow):
        t = lib.empty(*shape)
        lib.manual_seed(3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = getattr(lib.nn.init, name)(t, *args)
        assert r is t
        assert [(w.category, str(w.message), w.filename) for w in caught] == \
            [(FutureWarning, f"`nn.init.{name}` is now deprecated in favor of `nn.init.{name}_`.", __file__)]
        out.append(t.numpy())
    np.testing.assert_array_equal(out[1], out[0])
    assert getattr(flow.nn.init, name).__name__ == name


_DRAW = threading.Lock()


def _global_init(rank: int, name: str, shape: tuple, args: tuple) -> np.ndarray:
    place = flow.placement("cpu", [0, 1])
    t = flow.empty(*shape).to_global(place, B).to_global(sbp=S(0))
    with _DRAW, warnings.catch_warnings():   # simulated ranks share torch's generator: one rank draws at a time
        warnings.simplefilter("ignore", FutureWarning)
        flow.manual_seed(3)
        getattr(flow.nn.init, name)(t, *args)
    return t.to_global(sbp=B).to_local().numpy()


@pytest.mark.parametrize("name,shape,args", [OLD[0], OLD[3], OLD[4], OLD[9]], ids=["uniform", "eye", "dirac", "orthogonal"])
def test_deprecated_alias_initialises_global_tensors_whole(name, shape, args):
    # the old spellings wrapped the functions before they learned global tensors: each rank
    # initialised its shard as if it were a whole tensor (an eye of the shard's shape)
    t = torch.empty(*shape)
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        getattr(torch.nn.init, name)(t, *args)
    for got in world.simulate(2, lambda r: _global_init(r, name, shape, args)):
        np.testing.assert_array_equal(got, t.numpy())
