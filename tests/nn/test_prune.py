"""``nn.utils.prune`` vs torch's: each method's mask (random ones from the same seed), pruning
twice (a PruningContainer), global pruning, custom masks, state-dict keys, gradients through the
mask, ``remove`` and ``is_pruned``, and the argument errors."""
import numpy as np
import pytest
import torch
import torch.nn.utils.prune  # noqa: F401  (torch does not import it with torch.nn.utils)

import holoflow as flow


def _net(lib):
    lib.manual_seed(0)
    return lib.nn.Sequential(lib.nn.Conv2d(2, 4, 3), lib.nn.Flatten(), lib.nn.Linear(4 * 2 * 2, 3))


def _prune_all(lib):
    P = lib.nn.utils.prune
    net = _net(lib)
    lib.manual_seed(1)
    P.random_unstructured(net[0], "bias", amount=2)
    P.ln_structured(net[0], "weight", amount=0.5, n=2, dim=0)
    P.l1_unstructured(net[0], "weight", amount=0.3)                    # a container now
    P.random_structured(net[2], "weight", amount=0.25, dim=1)
    P.global_unstructured([(net[0], "weight"), (net[2], "weight")], pruning_method=P.L1Unstructured, amount=10)
    P.custom_from_mask(net[2], "bias", mask=lib.tensor([1.0, 0.0, 1.0]))
    x = lib.tensor(np.linspace(-1, 1, 2 * 2 * 4 * 4, dtype=np.float32).reshape(2, 2, 4, 4))
    (net(x) ** 2).sum().backward()
    out = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    out.update({f"grad:{n}": p.grad.numpy().copy() for n, p in net.named_parameters()})
    out["pruned"] = np.array(P.is_pruned(net))
    P.remove(net[0], "weight")
    P.remove(net[2], "bias")
    out.update({f"removed:{k}": v.detach().numpy().copy() for k, v in net.state_dict().items()})
    out["names"] = np.array(sorted(n for n, _ in net.named_parameters()))
    return out


def test_pruning_matches_torch():
    t, f = _prune_all(torch), _prune_all(flow)
    assert f.keys() == t.keys()
    for k in t:
        np.testing.assert_array_equal(f[k], t[k], err_msg=k)


def test_pruning_container_and_hooks_like_torch():
    for lib in (torch, flow):
        P = lib.nn.utils.prune
        lin = lib.nn.Linear(4, 3)
        P.l1_unstructured(lin, "weight", amount=0.25)
        P.l1_unstructured(lin, "weight", amount=0.25)
        hooks = [h for h in lin._forward_pre_hooks.values() if isinstance(h, P.BasePruningMethod)]
        assert len(hooks) == 1 and isinstance(hooks[0], P.PruningContainer) and len(hooks[0]) == 2
        assert int((lin.weight_mask == 0).sum()) == 5   # 3 of 12, then 2 of the 9 left


@pytest.mark.parametrize("call, exc, match", [
    (lambda P, lib: P.l1_unstructured(lib.nn.Linear(2, 2), "weight", amount=1.5), ValueError, "should either be"),
    (lambda P, lib: P.l1_unstructured(lib.nn.Linear(2, 2), "weight", amount=9), ValueError, "should be smaller"),
    (lambda P, lib: P.l1_unstructured(lib.nn.Linear(2, 2), "weight", amount="a"), TypeError, "Invalid type"),
    (lambda P, lib: P.ln_structured(lib.nn.Linear(2, 2), "bias", amount=1, n=2, dim=0), ValueError,
     "multidimensional"),
    (lambda P, lib: P.remove(lib.nn.Linear(2, 2), "weight"), ValueError, "has to be pruned"),
])
def test_errors_like_torch(call, exc, match):
    for lib in (torch, flow):
        with pytest.raises(exc, match=match):
            call(lib.nn.utils.prune, lib)
