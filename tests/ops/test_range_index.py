"""A Python ``range`` in an index reads as torch reads it (the list of its integers): values,
gradients and assignment vs torch, through ``expand_ranges`` (the rewrite getitem applies)."""
import pytest
import torch

import holoflow as flow
from holoflow.ops.range_index import expand_ranges

INDICES = [range(1, 3), (slice(None), range(0, 6, 2)), (range(2), range(1, 3)), range(0),
           (range(1, 4), Ellipsis), (1, range(5, 0, -2))]


@pytest.mark.parametrize("idx", INDICES, ids=[repr(i) for i in INDICES])
def test_range_index_matches_torch(idx):
    x = torch.arange(24.0, dtype=torch.float64).reshape(4, 6).requires_grad_()
    fx = flow.from_torch(x.detach().clone()).requires_grad_()
    want, got = x[idx], fx[expand_ranges(idx)]
    torch.testing.assert_close(got.to_torch(), want, rtol=0, atol=0)
    (want * want).sum().backward()
    (got * got).sum().backward()
    torch.testing.assert_close(fx.grad.to_torch(), x.grad, rtol=0, atol=0)
    t, f = x.detach().clone(), fx.detach().clone()
    t[idx] = -1.0
    f[expand_ranges(idx)] = -1.0
    torch.testing.assert_close(f.to_torch(), t, rtol=0, atol=0)


def test_other_indices_pass_through_unchanged():
    for idx in [3, slice(1, 2), (1, 2), [0, 1], None, Ellipsis]:
        assert expand_ranges(idx) is idx
