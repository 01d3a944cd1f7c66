"""ChainDataset and StackDataset against torch.utils.data (samples, lengths, batched __getitems__,
errors), their DataLoader interplay (batching, shuffling, workers), ``IterableDataset + other``,
and ConcatDataset's errors and helpers as torch's."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data as TD

import holoflow as flow
from holoflow.utils import data as D

X = np.arange(30, dtype=np.float32).reshape(10, 3)


def _lib(lib):
    return TD if lib is torch else D


def _stream_cls(lib, lo: int, hi: int, sized: bool = True):
    data = _lib(lib)

    class Stream(data.IterableDataset):
        """range(lo, hi), split between workers by their id."""

        def __iter__(self):
            info = data.get_worker_info()
            start, step = (lo, 1) if info is None else (lo + info.id, info.num_workers)
            return iter(range(start, hi, step))
    if sized:
        Stream.__len__ = lambda self: hi - lo
    return Stream


class _Rows:
    """A map-style dataset of X's rows with batched reads, counting how it was read."""

    def __init__(self, lib):
        self.lib, self.batched, self.single = lib, 0, 0

    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        self.single += 1
        return X[i]

    def __getitems__(self, indices):
        self.batched += 1
        return [X[i] * 10 for i in indices]   # (distinguishable from __getitem__'s values)


def _values(batch):
    if isinstance(batch, dict):
        return {k: _values(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_values(v) for v in batch]
    return np.asarray(batch.numpy() if hasattr(batch, "numpy") else batch).tolist()


# -- ChainDataset --------------------------------------------------------------------------------

def _chain(lib):
    return _lib(lib).ChainDataset([_stream_cls(lib, 0, 5)(), _stream_cls(lib, 10, 13)(), _stream_cls(lib, 20, 22)()])


def test_chain_dataset_iterates_and_sizes_like_torch():
    t, f = _chain(torch), _chain(flow)
    assert list(f) == list(t) == [0, 1, 2, 3, 4, 10, 11, 12, 20, 21]
    assert len(f) == len(t) == 10
    assert isinstance(f, D.IterableDataset)
    for lib in (torch, flow):   # any iterable of datasets, read as it is iterated
        lazy = _lib(lib).ChainDataset(d for d in [_stream_cls(lib, 0, 2, sized=False)()])
        assert [x for x in lazy] == [0, 1] and [x for x in lazy] == []


def test_chain_dataset_refusals_like_torch():
    for lib in (torch, flow):
        data = _lib(lib)
        mapped = data.TensorDataset(lib.arange(3))
        bad = data.ChainDataset([_stream_cls(lib, 0, 2)(), mapped])
        prefix = "^holoflow.utils.data.ChainDataset " if lib is flow else "^ChainDataset "
        with pytest.raises(AssertionError, match=prefix + "only supports IterableDataset"):
            list(bad)
        with pytest.raises(AssertionError, match=prefix + "only supports IterableDataset"):
            len(bad)
        with pytest.raises(TypeError):   # an unsized stream: len() fails as torch's
            len(data.ChainDataset([_stream_cls(lib, 0, 2, sized=False)()]))


def test_iterable_dataset_plus_is_a_chain_like_torch():
    for lib in (torch, flow):
        a, b = _stream_cls(lib, 0, 2)(), _stream_cls(lib, 5, 7)()
        c = a + b
        assert isinstance(c, _lib(lib).ChainDataset) and list(c) == [0, 1, 5, 6] and c.datasets == [a, b]


@pytest.mark.parametrize("kw", [dict(batch_size=3), dict(batch_size=4, drop_last=True), dict(batch_size=None),
                                dict(batch_size=3, num_workers=2)], ids=["b3", "b4-drop", "unbatched", "workers"])
def test_chain_dataset_in_a_dataloader_like_torch(kw):
    want = [_values(b) for b in TD.DataLoader(_chain(torch), **kw)]
    got = [_values(b) for b in D.DataLoader(_chain(flow), **kw)]
    assert got == want and len(got) > 1
    if kw.get("batch_size") and not kw.get("num_workers"):
        assert len(D.DataLoader(_chain(flow), **kw)) == len(TD.DataLoader(_chain(torch), **kw))


# -- StackDataset --------------------------------------------------------------------------------

def _stack(lib, named: bool):
    data = _lib(lib)
    xs = data.TensorDataset(lib.tensor(X))
    ys = [i * 2 for i in range(10)]
    return data.StackDataset(x=xs, y=ys) if named else data.StackDataset(xs, ys)


@pytest.mark.parametrize("named", [False, True], ids=["tuple", "dict"])
def test_stack_dataset_items_like_torch(named):
    t, f = _stack(torch, named), _stack(flow, named)
    assert len(f) == len(t) == 10
    for i in (0, 3, 9, -1):
        assert _values(f[i]) == _values(t[i])
        assert type(f[i]) is type(t[i])
    assert _values(f.__getitems__([4, 1, 1])) == _values(t.__getitems__([4, 1, 1]))
    assert isinstance(f.datasets, dict if named else tuple)


def test_stack_dataset_uses_nested_getitems_like_torch():
    for lib in (torch, flow):
        rows = _Rows(lib)
        ds = _lib(lib).StackDataset(a=rows, b=list(range(10)))
        batch = ds.__getitems__([2, 5])
        assert rows.batched == 1 and rows.single == 0
        assert _values(batch) == [{"a": (X[2] * 10).tolist(), "b": 2}, {"a": (X[5] * 10).tolist(), "b": 5}]
        assert _values(ds[2]) == {"a": X[2].tolist(), "b": 2}


def test_stack_dataset_refusals_like_torch():
    class Short:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i

        def __getitems__(self, indices):
            return indices[:-1]
    for lib in (torch, flow):
        data = _lib(lib)
        prefix = "^holoflow.utils.data.StackDataset: " if lib is flow else "^"
        with pytest.raises(ValueError, match=prefix + "Size mismatch between datasets"):
            data.StackDataset([1, 2], [1, 2, 3])
        with pytest.raises(ValueError, match=prefix + "Size mismatch between datasets"):
            data.StackDataset(a=[1, 2], b=[1])
        with pytest.raises(ValueError, match=prefix + "Supported either ``tuple``- \\(via ``args``\\) or"):
            data.StackDataset([1], b=[1])
        with pytest.raises(ValueError, match=prefix + "At least one dataset should be passed"):
            data.StackDataset()
        with pytest.raises(ValueError, match=prefix + "Nested dataset's output size mismatch. Expected 2, got 1"):
            data.StackDataset(Short(), [0, 1, 2]).__getitems__([0, 1])


@pytest.mark.parametrize("named", [False, True], ids=["tuple", "dict"])
@pytest.mark.parametrize("kw", [dict(batch_size=4), dict(batch_size=3, shuffle=True), dict(batch_size=4, num_workers=2)],
                         ids=["b4", "shuffle", "workers"])
def test_stack_dataset_in_a_dataloader_like_torch(named, kw):
    tkw, fkw = dict(kw), dict(kw)
    if kw.get("shuffle"):
        tkw["generator"], fkw["generator"] = torch.Generator().manual_seed(9), flow.Generator().manual_seed(9)
    want = list(TD.DataLoader(_stack(torch, named), **tkw))
    got = list(D.DataLoader(_stack(flow, named), **fkw))
    assert [_values(b) for b in got] == [_values(b) for b in want] and len(got) == -(-10 // kw["batch_size"])
    first = got[0]["x"][0] if named else got[0][0][0]
    assert isinstance(first, flow.Tensor) and tuple(first.shape) == (kw["batch_size"], 3)


def test_concat_of_stack_datasets_like_torch():
    for lib in (torch, flow):
        s = _stack(lib, False)
        cat = s + s
        assert isinstance(cat, _lib(lib).ConcatDataset) and len(cat) == 20 and _values(cat[13]) == _values(s[3])


# -- ConcatDataset: torch's errors and helpers ---------------------------------------------------

def test_concat_dataset_errors_and_helpers_like_torch():
    for lib in (torch, flow):
        data = _lib(lib)
        with pytest.raises(AssertionError, match="datasets should not be an empty iterable"):
            data.ConcatDataset([])
        with pytest.raises(AssertionError, match="ConcatDataset does not support IterableDataset"):
            data.ConcatDataset([_stream_cls(lib, 0, 2)()])
        cat = data.ConcatDataset([[1, 2, 3], [4, 5]])
        assert cat[-5] == 1 and cat[-1] == 5 and cat.cumulative_sizes == [3, 5]
        with pytest.raises(ValueError, match="absolute value of index should not exceed dataset length"):
            cat[-6]
        assert data.ConcatDataset.cumsum([[1], [2, 3], []]) == [1, 3, 3]
        with pytest.warns(FutureWarning, match="`cummulative_sizes` attribute is renamed to `cumulative_sizes`"):
            assert cat.cummulative_sizes == [3, 5]


def test_every_torch_dataset_class_exists():
    names = [n for n in dir(TD) if n.endswith("Dataset") and isinstance(getattr(TD, n), type)]
    assert "ChainDataset" in names and "StackDataset" in names
    assert not [n for n in names if not hasattr(D, n)]
    assert {"ChainDataset", "StackDataset"} <= set(D.__all__)
