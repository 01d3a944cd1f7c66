"""Shape ops vs torch: views, expand/repeat, cat/stack/split, tril/triu, roll/flip, diagonal, pad."""
import pytest
import torch
import torch.nn.functional as F

import holoflow as flow
from harness import BF16, F32, F64, Case, parametrize, randn

ALL = (F32, F64, BF16)


def one(*shape):
    """make() for a single random input of ``shape``."""
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})


def two(sa, sb):
    return lambda dt, g: ((randn(*sa, gen=g, dtype=dt), randn(*sb, gen=g, dtype=dt)), {})


CASES = [
    # reshape / view and friends: unchanged axes, merges, splits, -1, size-1 dims, zero-size
    Case("reshape-merge", lambda x: x.reshape(6, 4), lambda x: x.reshape(6, 4), one(2, 3, 4), dtypes=ALL),
    Case("reshape-split", lambda x: x.reshape(2, 3, 2, 2), lambda x: x.reshape(2, 3, 2, 2), one(6, 4)),
    Case("reshape-minus1", lambda x: flow.reshape(x, (-1, 3)), lambda x: torch.reshape(x, (-1, 3)), one(4, 3, 2)),
    Case("reshape-ones", lambda x: x.reshape(1, 3, 1, 4, 1), lambda x: x.reshape(1, 3, 1, 4, 1), one(3, 4)),
    Case("reshape-merge-all", lambda x: x.reshape(-1), lambda x: x.reshape(-1), one(3, 2, 5)),
    Case("reshape-zero", lambda x: x.reshape(0, 6), lambda x: x.reshape(0, 6), one(2, 0, 3)),
    Case("reshape-0d", lambda x: x.reshape(1, 1), lambda x: x.reshape(1, 1), one()),
    Case("view", lambda x: x.view(3, 8).view(2, 12), lambda x: x.view(3, 8).view(2, 12), one(2, 3, 4), dtypes=ALL),
    Case("view_as-reshape_as", lambda x, y: (x.view_as(y), x.reshape_as(y)),
         lambda x, y: (x.view_as(y), x.reshape_as(y)), two((2, 6), (3, 4))),
    Case("flatten", lambda x: (x.flatten(), flow.flatten(x, 1), x.flatten(0, 1), x.flatten(-2)),
         lambda x: (x.flatten(), torch.flatten(x, 1), x.flatten(0, 1), x.flatten(-2)), one(2, 3, 4)),
    Case("flatten-0d", lambda x: x.flatten(), lambda x: x.flatten(), one()),
    Case("unflatten", lambda x: x.unflatten(1, (2, -1)), lambda x: x.unflatten(1, (2, -1)), one(3, 6, 2)),
    Case("squeeze", lambda x: (x.squeeze(), x.squeeze(0), x.squeeze((2, -1)), flow.squeeze(x, 1)),
         lambda x: (x.squeeze(), x.squeeze(0), x.squeeze((2, -1)), torch.squeeze(x, 1)), one(1, 3, 1, 1)),
    Case("unsqueeze", lambda x: (x.unsqueeze(0), x.unsqueeze(-1), flow.unsqueeze(x, 1)),
         lambda x: (x.unsqueeze(0), x.unsqueeze(-1), torch.unsqueeze(x, 1)), one(3, 4), dtypes=ALL),
    # permutations
    Case("permute", lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1), one(2, 3, 4), dtypes=ALL),
    Case("permute-fn", lambda x: flow.permute(x, (1, 0, 2)), lambda x: torch.permute(x, (1, 0, 2)), one(0, 3, 2)),
    Case("permute-dims-kw", lambda x: (flow.permute(x, dims=(1, 0, 2)), x.permute(dims=[2, 1, 0])),
         lambda x: (torch.permute(x, dims=(1, 0, 2)), x.permute(dims=[2, 1, 0])), one(2, 3, 4)),
    Case("transpose", lambda x: (x.transpose(0, 2), flow.swapaxes(x, 1, -1), x.swapdims(0, 1)),
         lambda x: (x.transpose(0, 2), torch.swapaxes(x, 1, -1), x.swapdims(0, 1)), one(2, 3, 4)),
    Case("t", lambda x, v: (x.t(), flow.t(v)), lambda x, v: (x.t(), torch.t(v)), two((3, 4), (5,))),
    Case("T-mT", lambda x, m: (x.mT, m.T), lambda x, m: (x.mT, m.T), two((2, 3, 4), (3, 5))),
    Case("movedim", lambda x: (x.movedim(0, -1), flow.movedim(x, (0, 1), (2, 0))),
         lambda x: (x.movedim(0, -1), torch.movedim(x, (0, 1), (2, 0))), one(2, 3, 4)),
    # expand / repeat
    Case("expand", lambda x: x.expand(2, 3, 4), lambda x: x.expand(2, 3, 4), one(3, 1), dtypes=ALL),
    Case("expand-minus1", lambda x: x.expand(-1, 5, -1), lambda x: x.expand(-1, 5, -1), one(2, 1, 3)),
    Case("expand_as-broadcast_to", lambda x, y: (x.expand_as(y), flow.broadcast_to(x, (2, 4))),
         lambda x, y: (x.expand_as(y), torch.broadcast_to(x, (2, 4))), two((4,), (3, 4))),
    Case("repeat", lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3), one(3, 2), dtypes=ALL),
    Case("repeat-same-rank", lambda x: x.repeat(1, 2), lambda x: x.repeat(1, 2), one(3, 2)),
    Case("tile", lambda x: (flow.tile(x, (2,)), x.tile((2, 1, 1))), lambda x: (torch.tile(x, (2,)), x.tile((2, 1, 1))),
         one(2, 3)),
    Case("repeat_interleave", lambda x: (x.repeat_interleave(2, 1), flow.repeat_interleave(x, 3)),
         lambda x: (x.repeat_interleave(2, 1), torch.repeat_interleave(x, 3)), one(2, 3), dtypes=ALL),
    Case("repeat_interleave-tensor", lambda x, r: (x.repeat_interleave(r, 0), flow.repeat_interleave(x, r[:1], 1)),
         lambda x, r: (x.repeat_interleave(r, 0), torch.repeat_interleave(x, r[:1], 1)),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt), torch.tensor([1, 3, 0, 2])), {}), dtypes=ALL),
    # cat / stack / split
    Case("cat", lambda a, b: flow.cat([a, b], 1), lambda a, b: torch.cat([a, b], 1), two((2, 3), (2, 5)), dtypes=ALL),
    Case("cat-neg-dim", lambda a, b: flow.concat((a, b, a), -1), lambda a, b: torch.concat((a, b, a), -1),
         two((2, 3, 1), (2, 3, 2))),
    Case("cat-zero-size", lambda a, b: flow.cat([a, b]), lambda a, b: torch.cat([a, b]), two((0, 3), (2, 3))),
    Case("cat-legacy-empty", lambda a, b: flow.cat([a, b]), lambda a, b: torch.cat([a, b]), two((0,), (2, 3)),
         gradcheck=False),
    Case("stack", lambda a, b: (flow.stack([a, b]), flow.stack((a, b), -1)),
         lambda a, b: (torch.stack([a, b]), torch.stack((a, b), -1)), two((2, 3), (2, 3)), dtypes=ALL),
    Case("hstack-vstack", lambda a, b: (flow.hstack([a, b]), flow.vstack([a, b])),
         lambda a, b: (torch.hstack([a, b]), torch.vstack([a, b])), two((3,), (3,))),
    Case("split-int", lambda x: x.split(2, 1), lambda x: x.split(2, 1), one(3, 5), dtypes=ALL),
    Case("split-sizes", lambda x: flow.split(x, [1, 3, 0], 0), lambda x: torch.split(x, [1, 3, 0], 0), one(4, 2)),
    Case("chunk", lambda x: (x.chunk(3, 1), flow.chunk(x, 2)), lambda x: (x.chunk(3, 1), torch.chunk(x, 2)),
         one(5, 7)),
    Case("tensor_split", lambda x: (x.tensor_split(3, 1), flow.tensor_split(x, [1, 4], 1)),
         lambda x: (x.tensor_split(3, 1), torch.tensor_split(x, [1, 4], 1)), one(2, 7)),
    Case("unbind", lambda x: (x.unbind(1), flow.unbind(x)), lambda x: (x.unbind(1), torch.unbind(x)),
         one(2, 3, 2)),
    # triangles, roll, flip, diagonals
    Case("tril-triu", lambda x: (x.tril(), flow.triu(x, 1), flow.tril(x, -1)),
         lambda x: (x.tril(), torch.triu(x, 1), torch.tril(x, -1)), one(2, 4, 5), dtypes=ALL),
    Case("roll", lambda x: (x.roll(1, 0), flow.roll(x, (2, -1), (1, 2)), flow.roll(x, 3)),
         lambda x: (x.roll(1, 0), torch.roll(x, (2, -1), (1, 2)), torch.roll(x, 3)), one(3, 4, 2), dtypes=ALL),
    Case("flip", lambda x: (x.flip(0), flow.flip(x, (1, 2)), flow.fliplr(x), x.flipud()),
         lambda x: (x.flip(0), torch.flip(x, (1, 2)), torch.fliplr(x), x.flipud()), one(3, 4, 2), dtypes=ALL),
    Case("flip-dims-kw", lambda x: (flow.flip(x, dims=[2]), x.flip(dims=(0, 1)), x.flip(1, 2)),
         lambda x: (torch.flip(x, dims=[2]), x.flip(dims=(0, 1)), x.flip(1, 2)), one(3, 4, 2)),
    Case("diagonal", lambda x: (x.diagonal(), flow.diagonal(x, 1, 0, 2), x.diagonal(-1, -1, -2)),
         lambda x: (x.diagonal(), torch.diagonal(x, 1, 0, 2), x.diagonal(-1, -1, -2)), one(3, 4, 5)),
    Case("diag", lambda v, m: (flow.diag(v), v.diag(1), flow.diag(m), m.diag(-1)),
         lambda v, m: (torch.diag(v), v.diag(1), torch.diag(m), m.diag(-1)), two((3,), (3, 4))),
    # pad (nn.functional-compatible)
    Case("pad-constant", lambda x: flow.pad(x, (1, 2)), lambda x: F.pad(x, (1, 2)), one(2, 3), dtypes=ALL),
    Case("pad-constant-value", lambda x: flow.pad(x, (1, 0, 0, 2), value=1.5), lambda x: F.pad(x, (1, 0, 0, 2), value=1.5),
         one(2, 3, 2)),
    Case("pad-crop", lambda x: flow.pad(x, (-1, 1, 1, -1)), lambda x: F.pad(x, (-1, 1, 1, -1)), one(3, 4)),
    Case("pad-reflect", lambda x: flow.pad(x, (2, 1), mode="reflect"), lambda x: F.pad(x, (2, 1), mode="reflect"),
         one(2, 3, 4), dtypes=ALL),
    Case("pad-reflect-2d", lambda x: flow.pad(x, (1, 2, 2, 1), "reflect"), lambda x: F.pad(x, (1, 2, 2, 1), "reflect"),
         one(1, 2, 3, 4)),
    Case("pad-replicate", lambda x: flow.pad(x, (3, 1, 0, 2), "replicate"), lambda x: F.pad(x, (3, 1, 0, 2), "replicate"),
         one(1, 2, 3, 4)),
    Case("pad-circular", lambda x: flow.pad(x, (1, 2), "circular"), lambda x: F.pad(x, (1, 2), "circular"),
         one(2, 3, 4)),
    Case("pad-circular-2d", lambda x: flow.pad(x, (2, 0, 1, 1), "circular"), lambda x: F.pad(x, (2, 0, 1, 1), "circular"),
         one(1, 2, 3, 4)),
    # a chain: grads flow through composed views
    Case("chain", lambda x: x.transpose(0, 1).reshape(4, -1).unsqueeze(0).expand(2, 4, 6).flip(1)[..., 1:],
         lambda x: x.transpose(0, 1).reshape(4, -1).unsqueeze(0).expand(2, 4, 6).flip(1)[..., 1:], one(3, 4, 2)),
]



def cloned(fn):
    """Clones the outputs: the harness's gradcheck perturbs inputs in place and reads the outputs
    after restoring them, which a view output would follow (its finite difference reads 0)."""
    def run(*args, **kwargs):
        return _clone(fn(*args, **kwargs))
    return run


def _clone(out):
    if isinstance(out, flow.Tensor):
        return out.clone()
    if isinstance(out, (list, tuple)):
        return type(out)(_clone(o) for o in out) if not hasattr(out, "_fields") else type(out)(*map(_clone, out))
    return out


for _case in CASES:
    _case.flow_fn = cloned(_case.flow_fn)
globals().update(parametrize(CASES))


def test_reshape_error_names_shapes():
    x = flow.randn(2, 3)
    with pytest.raises(ValueError, match=r"^holoflow\.reshape: cannot reshape a tensor of shape \(2, 3\) "
                                         r"\(6 elements\) into \(4, 2\) \(8 elements\)"):
        x.reshape(4, 2)
    with pytest.raises(ValueError, match=r"holoflow\.view: .*\(2, 3\).*\(4, -1\)"):
        x.view(4, -1)
    with pytest.raises(ValueError, match="at most one -1"):
        x.reshape(-1, -1)


def test_view_of_non_contiguous_suggests_reshape():
    x = flow.randn(3, 4).t()
    with pytest.raises(RuntimeError, match=r"holoflow\.view: .*use \.reshape"):
        x.view(12)
    assert x.reshape(12).shape == (12,)


def test_view_aliases_storage():
    x = flow.zeros(2, 3)
    v = x.view(6)
    with flow.no_grad():
        v.add_(1)
    assert x.tolist() == [[1.0] * 3] * 2


def test_bad_dims_are_clear():
    x = flow.randn(2, 3)
    with pytest.raises(IndexError, match=r"holoflow\.transpose: dim 2 is out of range"):
        x.transpose(0, 2)
    with pytest.raises(IndexError, match=r"holoflow\.unsqueeze: dim 4"):
        x.unsqueeze(4)
    with pytest.raises(IndexError, match=r"holoflow\.cat: dim -3"):
        flow.cat([x, x], -3)


def test_flip_permute_dims_argument_errors_match_torch():
    x = flow.randn(2, 3)
    for fn, name in ((lambda: x.flip(), "missing 1 required"), (lambda: x.flip(0, dims=[1]), "multiple values"),
                     (lambda: x.permute(1, dims=(1, 0)), "multiple values"), (x.permute, "missing 1 required")):
        with pytest.raises(TypeError, match=name):
            fn()


def test_permute_needs_a_permutation():
    x = flow.randn(2, 3, 4)
    with pytest.raises(ValueError, match=r"holoflow\.permute: dims \(0, 0, 1\) are not a permutation"):
        x.permute(0, 0, 1)
    with pytest.raises(ValueError, match="not a permutation"):
        x.permute(1, 0)


def test_cat_mismatch_names_tensor_index_and_shapes():
    a, b, c = flow.randn(2, 3), flow.randn(2, 3), flow.randn(4, 3)
    with pytest.raises(ValueError, match=r"holoflow\.cat: tensor 2 has shape \(4, 3\) but tensor 0 has shape "
                                         r"\(2, 3\); all sizes must match except in dim 1"):
        flow.cat([a, b, c], 1)
    with pytest.raises(ValueError, match=r"holoflow\.cat: tensor 1 has shape \(2, 3, 1\)"):
        flow.cat([a, flow.randn(2, 3, 1)])
    with pytest.raises(ValueError, match=r"holoflow\.stack: tensor 1 has shape \(4, 3\)"):
        flow.stack([a, c])
    with pytest.raises(ValueError, match="non-empty"):
        flow.cat([])


def test_expand_and_split_errors():
    with pytest.raises(ValueError, match=r"holoflow\.expand: cannot expand shape \(3, 2\)"):
        flow.randn(3, 2).expand(3, 4)
    with pytest.raises(ValueError, match=r"holoflow\.split: sizes \[1, 1\] sum to 2"):
        flow.randn(3).split([1, 1])
    with pytest.raises(ValueError, match=r"holoflow\.pad: unknown mode"):
        flow.pad(flow.randn(3), (1, 1), mode="wrap")


def test_sbp_reshape_rules_are_declared():
    """The reshape rule keeps untouched axes and maps a merged group's leading dim."""
    from holoflow.core.registry import Meta
    from holoflow.core.sbp import S
    from holoflow.ops.shape import RESHAPE
    sigs = RESHAPE.sbp([Meta((4, 3, 5), torch.float32)], {"shape": (12, 5)})
    assert ((S(0),), (S(0),)) in sigs and ((S(2),), (S(1),)) in sigs
    assert ((S(1),), (S(0),)) not in sigs
    sigs = RESHAPE.sbp([Meta((12, 5), torch.float32)], {"shape": (4, 3, 5)})
    # a split's leading dim carries the split where shards are whole rows of it (checked per mesh by choose)
    assert ((S(0),), (S(0),)) in sigs and ((S(1),), (S(2),)) in sigs


@pytest.mark.parametrize("case", ["dim0", "dim1-broadcast", "flat", "flat-0d", "zeros", "output_size"])
def test_repeat_interleave_tensor_repeats_matches_torch(case):
    """Per-element counts as a tensor (ragged batching: a graph's batch vector, say), forward and
    backward; repeat_interleave(repeats) alone gives the repeated arange."""
    reps, dim, kw = {"dim0": ([1, 3, 0, 2], 0, {}), "dim1-broadcast": ([2], 1, {}), "flat": ([1, 0, 2] * 4, None, {}),
                     "flat-0d": (3, None, {}), "zeros": ([0, 0, 0, 0], 0, {}),
                     "output_size": ([2, 1, 1, 2], 0, {"output_size": 6})}[case]
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    fx = flow.from_torch(x.detach().clone()).requires_grad_()
    r = torch.tensor(reps)
    want, got = torch.repeat_interleave(x, r, dim, **kw), fx.repeat_interleave(flow.from_torch(r), dim, **kw)
    torch.testing.assert_close(got.to_torch(), want.detach())
    up = torch.randn(want.shape, dtype=torch.float64)
    want.backward(up)
    got.backward(flow.from_torch(up))
    torch.testing.assert_close(fx.grad.to_torch(), x.grad)
    if r.dim() == 1:
        torch.testing.assert_close(flow.repeat_interleave(flow.from_torch(r)).to_torch(), torch.repeat_interleave(r))


def test_repeat_interleave_bad_repeats_raise_torchs_errors():
    x = torch.arange(6.0).view(2, 3)
    bad = [(torch.tensor([[1, 2]]), 0, "0-dim or 1-dim"), (torch.tensor([1, 2, 3]), 0, r"repeats.size\(0\) = 3 and input.size\(0\) = 2"),
           (torch.tensor([1, -2]), 0, "can not be negative"), (torch.tensor([1, 2]), 0, "allocated size", 4)]
    for lib, conv in ((torch, lambda t: t), (flow, flow.from_torch)):
        for r, dim, msg, *size in bad:
            with pytest.raises(RuntimeError, match=msg):
                lib.repeat_interleave(conv(x), conv(r), dim, **({"output_size": size[0]} if size else {}))
        with pytest.raises(RuntimeError, match="1D vector"):
            lib.repeat_interleave(conv(torch.tensor([[2, 0, 1]])))
        with pytest.raises(RuntimeError, match="Repeats must be non-negative"):
            lib.repeat_interleave(conv(x), -1)
        with pytest.raises(RuntimeError, match="Invalid output_size, expected 4 but got 5"):
            lib.repeat_interleave(conv(x), 2, 0, output_size=5)


@pytest.mark.parametrize("pads", [(-1, 2), (2, -1), (3, -2), (-2, -3), (1, -1, -1, 2)])
def test_circular_pad_with_negative_pads_backward_matches_torch(pads):
    """torch crops negative pads first, then wraps within what is left; the gradient sent the
    wrapped positions' gradients to the uncropped tensor's ends (silently wrong)."""
    shape = (1, 2, 9) if len(pads) == 2 else (1, 2, 5, 9)   # (torch's non-constant pads: per input rank)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.pad(x, pads, mode="circular")
    w = torch.randn(y.shape, dtype=torch.float64)
    (y * w).sum().backward()
    fx = flow.from_torch(x.detach().clone()).requires_grad_()
    fy = flow.nn.functional.pad(fx, pads, mode="circular")
    (fy * flow.from_torch(w)).sum().backward()
    torch.testing.assert_close(fy.detach().to_torch(), y.detach())
    torch.testing.assert_close(fx.grad.to_torch(), x.grad)
