"""Creation functions' dtype inference and the shape, search, statistics and scatter/gather
functions with their options, against torch (values, dtypes, shapes; several outputs each).
Found: take_along_dim did not broadcast its input and indices (a result of the indices' shape)
and needed dim; scatter refused reduce="add" / "multiply"."""
from __future__ import annotations

import itertools

import torch

import holoflow as flow
from harness import same_as_torch, sweep



def test_creation_dtype_inference_matches_torch():
    cases = []
    for args, dt in itertools.product([(5,), (1, 5), (0, 1, 0.1), (1, 2.5, 0.5), (10, 0, -3), (0.5, 3), (-2, 2, 0.75)],
                                      [None, torch.int32, torch.float64, torch.int64, torch.float16]):
        kw = {} if dt is None else {"dtype": dt}
        cases.append((f"arange {args} {kw}", lambda a=args, kw=kw: torch.arange(*a, **kw),
                      lambda a=args, kw=kw: flow.arange(*a, **kw)))
    for (start, end, steps), dt in itertools.product([(0, 1, 5), (1, 0, 3), (0, 10, 1), (0, 5, 0), (-1, 1, 4)],
                                                     [None, torch.int64, torch.float64, torch.int32]):
        kw = {} if dt is None else {"dtype": dt}
        for fn, extra in (("linspace", {}), ("logspace", {}), ("logspace", {"base": 2})):
            cases.append((f"{fn} {start} {end} {steps} {kw} {extra}",
                          lambda fn=fn, a=(start, end, steps), kw={**kw, **extra}: getattr(torch, fn)(*a, **kw),
                          lambda fn=fn, a=(start, end, steps), kw={**kw, **extra}: getattr(flow, fn)(*a, **kw)))
    for fill, dt in itertools.product([True, 3, 2.5, 1 + 2j], [None, torch.float32, torch.int64]):
        kw = {} if dt is None else {"dtype": dt}
        cases.append((f"full {fill} {kw}", lambda v=fill, kw=kw: torch.full((2, 2), v, **kw),
                      lambda v=fill, kw=kw: flow.full((2, 2), v, **kw)))
    for n in [(3,), (3, 5), (4, 2), (0,)]:
        cases.append((f"eye {n}", lambda n=n: torch.eye(*n), lambda n=n: flow.eye(*n)))
    for fn, args in itertools.product(["tril_indices", "triu_indices"], [(3, 3, 0), (4, 3, 1), (3, 5, -1), (3, 4, 2)]):
        cases.append((f"{fn} {args}", lambda fn=fn, a=args: getattr(torch, fn)(*a),
                      lambda fn=fn, a=args: getattr(flow, fn)(*a)))
    for data, fn in itertools.product([[1, 2], [1, 2.0], [True, 2], [[1, 2], [3, 4]], [1, 2j], 3, 3.5, True, [], [[]],
                                       [1.5, float("nan")], (1, 2)], ["tensor", "as_tensor"]):
        cases.append((f"{fn} {data}", lambda fn=fn, d=data: getattr(torch, fn)(d),
                      lambda fn=fn, d=data: getattr(flow, fn)(d)))
    sweep(same_as_torch, cases)


# (m: torch or holoflow, a: the (2, 3, 4) tensor arange(24) of that library)
FUNCTIONS = [
    ("split 2", lambda m, a: m.split(a, 2, dim=1)),
    ("split list", lambda m, a: m.split(a, [1, 2], dim=1)),
    ("chunk 3", lambda m, a: m.chunk(a, 3, dim=2)),
    ("chunk 5", lambda m, a: m.chunk(a, 5, dim=2)),
    ("tensor_split 3", lambda m, a: m.tensor_split(a, 3, dim=2)),
    ("tensor_split idx", lambda m, a: m.tensor_split(a, [1, 3], dim=2)),
    ("movedim", lambda m, a: m.movedim(a, (0, 1), (2, 0))),
    ("flatten 1", lambda m, a: m.flatten(a, 1)),
    ("flatten -2", lambda m, a: m.flatten(a, -2, -1)),
    ("unflatten", lambda m, a: m.unflatten(a, 2, (2, -1))),
    ("squeeze multi", lambda m, a: m.squeeze(a.reshape(1, 2, 1, 12), (0, 2))),
    ("repeat_interleave", lambda m, a: m.repeat_interleave(a, 2, dim=1)),
    ("roll multi", lambda m, a: m.roll(a, (1, -2), (0, 2))),
    ("roll flat", lambda m, a: m.roll(a, 5)),
    ("flip", lambda m, a: m.flip(a, (0, 2))),
    ("rot90", lambda m, a: m.rot90(a, 3, (1, 2))),
    ("rot90 -1", lambda m, a: m.rot90(a, -1, (0, 2))),
    ("narrow", lambda m, a: m.narrow(a, 2, 1, 2)),
    ("tril", lambda m, a: m.tril(a, -1)),
    ("triu", lambda m, a: m.triu(a, 2)),
    ("diag_embed", lambda m, a: m.diag_embed(a, 1, 0, 2)),
    ("diagonal", lambda m, a: m.diagonal(a, -1, 1, 2)),
    ("cummax", lambda m, a: m.cummax(a, -1)),
    ("logcumsumexp", lambda m, a: m.logcumsumexp(a, 1)),
    ("take", lambda m, a: m.take(a, m.tensor([0, 5, 23]))),
    ("masked_select", lambda m, a: m.masked_select(a, a > 10)),
    ("where scalar", lambda m, a: m.where(a > 5, a, 0.5)),
    ("where 1arg", lambda m, a: m.where(a > 20)),
    ("nonzero tuple", lambda m, a: m.nonzero(a > 20, as_tuple=True)),
    ("argwhere", lambda m, a: m.argwhere(a > 20)),
    ("atleast_3d", lambda m, a: m.atleast_3d(a[0, 0])),
    ("block_diag", lambda m, a: m.block_diag(a[0], a[1, :2])),
    ("cartesian_prod", lambda m, a: m.cartesian_prod(a[0, 0], a[1, 0, :2])),
    ("combinations", lambda m, a: m.combinations(a[0, 0], 2)),
    ("combinations wr", lambda m, a: m.combinations(a[0, 0, :3], 2, with_replacement=True)),
    ("histc", lambda m, a: m.histc(a, 5, 0, 20)),
    ("bincount w", lambda m, a: m.bincount(m.tensor([0, 2, 2, 5]), m.tensor([0.5, 1.0, 2.0, 3.0]), minlength=7)),
    ("unique sorted inv cnt", lambda m, a: m.unique(m.tensor([3, 1, 3, 2, 1]), return_inverse=True, return_counts=True)),
    ("unique dim", lambda m, a: m.unique(m.tensor([[1, 2], [1, 2], [0, 1]]), dim=0)),
    ("unique_consecutive", lambda m, a: m.unique_consecutive(m.tensor([1, 1, 2, 2, 3, 1]), return_counts=True)),
    ("searchsorted right", lambda m, a: m.searchsorted(m.tensor([1, 3, 5, 7]), m.tensor([3, 6, 9]), right=True)),
    ("searchsorted side", lambda m, a: m.searchsorted(m.tensor([1, 3, 5, 7]), m.tensor([3, 6]), side="right")),
    ("bucketize", lambda m, a: m.bucketize(m.tensor([0.5, 3.0, 9.0]), m.tensor([1.0, 3.0, 5.0]), right=True)),
    ("kthvalue", lambda m, a: m.kthvalue(a, 2, 1)),
    ("topk smallest", lambda m, a: m.topk(a, 2, 2, largest=False)),
    ("sort desc stable", lambda m, a: m.sort(m.tensor([3, 1, 3, 2]), descending=True, stable=True)),
    ("median dim", lambda m, a: m.median(a, 1)),
    ("mode", lambda m, a: m.mode(m.tensor([[1, 2, 2], [3, 3, 1]]), 1)),
    ("nanmedian", lambda m, a: m.nanmedian(m.tensor([1.0, float('nan'), 3.0, 2.0]))),
    ("quantile dims", lambda m, a: m.quantile(a, m.tensor([0.25, 0.5]), dim=1, keepdim=True)),
    ("quantile interp", lambda m, a: m.quantile(a, 0.3, interpolation="midpoint")),
    ("std_mean", lambda m, a: m.std_mean(a, 1, correction=0)),
    ("var_mean", lambda m, a: m.var_mean(a, (0, 2), keepdim=True)),
    ("aminmax", lambda m, a: m.aminmax(a, dim=1)),
    ("gather", lambda m, a: m.gather(a, 2, m.tensor([[[0, 3]] * 3] * 2))),
    ("scatter reduce", lambda m, a: m.scatter(a, 2, m.tensor([[[0, 0]] * 3] * 2), 1.5, reduce="add")),
    ("scatter_reduce mean", lambda m, a: m.scatter_reduce(a, 2, m.tensor([[[0, 0, 1]] * 3] * 2), a[..., :3], "mean", include_self=False)),
    ("index_add alpha", lambda m, a: m.index_add(a, 1, m.tensor([0, 2]), a[:, :2], alpha=2)),
    ("index_reduce", lambda m, a: m.index_reduce(a, 1, m.tensor([0, 0]), a[:, :2], "amax")),
    ("take_along_dim", lambda m, a: m.take_along_dim(a, m.tensor([[[1], [0], [2]]]), dim=1)),
    ("take_along_dim none", lambda m, a: m.take_along_dim(a, m.tensor([3, 7]))),
    ("diff", lambda m, a: m.diff(a, 2, dim=2, prepend=a[..., :1])),
    ("cumulative_trapezoid", lambda m, a: m.cumulative_trapezoid(a, dx=0.5)),
    ("trapezoid x", lambda m, a: m.trapezoid(a, m.tensor([0.0, 1.0, 3.0, 4.0]))),
    ("vander", lambda m, a: m.vander(m.tensor([1, 2, 3]), 4, increasing=True)),
    ("kron", lambda m, a: m.kron(a[0, :2, :2], a[1, :2, :3])),
    ("tensordot dims", lambda m, a: m.tensordot(a, a, dims=([1, 2], [1, 2]))),
    ("einsum ellipsis", lambda m, a: m.einsum("b...i,b...i->b...", a, a)),
    ("cross dim", lambda m, a: m.cross(a[:, :, :3], a[:, :, 1:], dim=2)),
    ("renorm", lambda m, a: m.renorm(a, 2, 0, 5.0)),
    ("clamp tensor", lambda m, a: m.clamp(a, min=a[0:1] * 0.5, max=20)),
    ("nan_to_num", lambda m, a: m.nan_to_num(a / (a - 3), nan=0.0, posinf=9.0)),
    ("count_nonzero dims", lambda m, a: m.count_nonzero(a - 5, dim=(0, 2))),
    ("isin", lambda m, a: m.isin(a, m.tensor([1.0, 5.0, 7.0]), invert=True)),
    ("histogram", lambda m, a: m.histogram(a.flatten(), bins=4, range=(0.0, 24.0))),
    ("meshgrid xy", lambda m, a: m.meshgrid(a[0, 0], a[1, 0, :2], indexing="xy")),
    ("broadcast_to", lambda m, a: m.broadcast_to(a[:, :1], (2, 3, 4))),
    ("stack dim -1", lambda m, a: m.stack([a, a], -1)),
    ("hstack", lambda m, a: m.hstack([a[0], a[1]])),
    ("column_stack", lambda m, a: m.column_stack([a[0, 0], a[1, 0]])),
    ("dstack", lambda m, a: m.dstack([a[0], a[1]])),
]


def test_shape_search_statistics_and_scatter_functions_match_torch():
    x = torch.arange(24.0).reshape(2, 3, 4)
    fx = flow.from_torch(x)
    sweep(same_as_torch, [(name, lambda fn=fn: fn(torch, x), lambda fn=fn: fn(flow, fx)) for name, fn in FUNCTIONS])
