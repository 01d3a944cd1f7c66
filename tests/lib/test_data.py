"""utils.data vs torch.utils.data: orderings, seeding, collate, workers, DistributedSampler."""
import collections

import numpy as np
import pytest
import torch
import torch.utils.data as TD

import holoflow as flow
from holoflow.utils import data as D

N = 23
X = np.arange(N * 3, dtype=np.float32).reshape(N, 3)


class Items(D.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"x": X[i], "y": i, "w": float(i) / 2, "name": f"s{i}"}


class TItems(TD.Dataset):
    __len__, __getitem__ = Items.__len__, Items.__getitem__


class Stream(D.IterableDataset):
    def __iter__(self):
        info = D.get_worker_info()
        lo, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(lo, 20, step))


def _ys(loader):
    return [b["y"].tolist() for b in loader]


@pytest.mark.parametrize("kw", [dict(batch_size=4, shuffle=True), dict(batch_size=5, shuffle=True, drop_last=True),
                                dict(batch_size=3, shuffle=False)])
def test_ordering_equals_torch_with_generator(kw):
    tl = TD.DataLoader(TItems(), generator=torch.Generator().manual_seed(11), **kw)
    fl = D.DataLoader(Items(), generator=flow.Generator().manual_seed(11), **kw)
    for _ in range(3):   # epochs keep drawing from the generator as torch's
        assert _ys(fl) == _ys(tl)
    assert len(fl) == len(tl)


def test_ordering_equals_torch_with_global_seed():
    torch.manual_seed(3)
    expect = _ys(TD.DataLoader(TItems(), batch_size=4, shuffle=True))
    flow.manual_seed(3)
    assert _ys(D.DataLoader(Items(), batch_size=4, shuffle=True)) == expect


def test_drop_last_and_len():
    fl = D.DataLoader(Items(), batch_size=5, drop_last=True)
    batches = list(fl)
    assert len(fl) == len(batches) == 4 and all(b["x"].shape == (5, 3) for b in batches)
    assert len(D.DataLoader(Items(), batch_size=5)) == 5


def test_default_collate_types():
    Point = collections.namedtuple("Point", "a b")
    batch = [(np.ones(2, dtype=np.float32) * i, i, 0.5 * i, Point(i, flow.tensor([i, i])), {"k": np.int64(i)},
              torch.tensor([i]), "s") for i in range(3)]
    out = D.default_collate(batch)
    assert isinstance(out, list) and len(out) == 7
    assert isinstance(out[0], flow.Tensor) and out[0].shape == (3, 2) and out[0].dtype == flow.float32
    assert out[1].dtype == flow.int64 and out[1].tolist() == [0, 1, 2]
    assert out[2].dtype == flow.float64
    assert isinstance(out[3], Point) and out[3].b.shape == (3, 2) and out[3].a.tolist() == [0, 1, 2]
    assert out[4]["k"].tolist() == [0, 1, 2] and isinstance(out[5], flow.Tensor)
    assert out[6] == ["s", "s", "s"]
    ref = TD.default_collate([(np.ones(2) * i, i, 0.5 * i) for i in range(3)])
    got = D.default_collate([(np.ones(2) * i, i, 0.5 * i) for i in range(3)])
    for r, g in zip(ref, got):
        assert torch.equal(g.to_torch(), r) and g.to_torch().dtype == r.dtype
    with pytest.raises(RuntimeError, match="equal size"):
        D.default_collate([[1, 2], [1]])
    with pytest.raises(TypeError, match="found object"):
        D.default_collate([object(), object()])


def test_tensor_dataset_subset_concat_random_split():
    x, y = flow.arange(10), flow.arange(10) * 2
    ds = D.TensorDataset(x, y)
    assert len(ds) == 10 and [v.item() for v in ds[3]] == [3, 6]
    with pytest.raises(ValueError, match="size mismatch"):
        D.TensorDataset(x, flow.arange(3))
    cat = ds + D.TensorDataset(flow.arange(5), flow.arange(5))
    assert len(cat) == 15 and cat[12][0].item() == 2 and cat[-1][0].item() == 4
    for lengths in ([3, 7], [0.3, 0.7], [0.5, 0.25, 0.25]):
        ref = TD.random_split(range(10), lengths, generator=torch.Generator().manual_seed(4))
        got = D.random_split(ds, lengths, generator=flow.Generator().manual_seed(4))
        assert [s.indices for s in got] == [s.indices for s in ref]
    with pytest.raises(ValueError, match="sum of lengths"):
        D.random_split(ds, [3, 3])
    sub = D.Subset(ds, [9, 0])
    assert sub[0][0].item() == 9 and len(sub) == 2


def test_samplers_equal_torch():
    g = lambda: torch.Generator().manual_seed(5)   # noqa: E731
    fg = lambda: flow.Generator().manual_seed(5)   # noqa: E731
    assert list(D.RandomSampler(range(10), generator=fg())) == list(TD.RandomSampler(range(10), generator=g()))
    for kw in (dict(replacement=True, num_samples=70), dict(num_samples=25)):
        assert list(D.RandomSampler(range(10), generator=fg(), **kw)) == \
            list(TD.RandomSampler(range(10), generator=g(), **kw))
    assert list(D.SubsetRandomSampler([4, 8, 9, 1], generator=fg())) == \
        list(TD.SubsetRandomSampler([4, 8, 9, 1], generator=g()))
    w = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    for repl in (True, False):
        assert list(D.WeightedRandomSampler(w, 5, repl, generator=fg())) == \
            list(TD.WeightedRandomSampler(w, 5, repl, generator=g()))
    for drop in (True, False):
        assert list(D.BatchSampler(D.SequentialSampler(range(10)), 3, drop)) == \
            list(TD.BatchSampler(TD.SequentialSampler(range(10)), 3, drop))
        assert len(D.BatchSampler(range(10), 3, drop)) == len(TD.BatchSampler(range(10), 3, drop))


@pytest.mark.parametrize("n,replicas,shuffle,drop_last", [(23, 4, True, False), (23, 4, True, True),
                                                          (10, 3, False, False), (2, 5, True, False),
                                                          (12, 4, False, True)])
def test_distributed_sampler_splits_equal_torch(n, replicas, shuffle, drop_last):
    for epoch in (0, 3):
        for rank in range(replicas):
            kw = dict(num_replicas=replicas, rank=rank, shuffle=shuffle, seed=7, drop_last=drop_last)
            t, f = TD.DistributedSampler(range(n), **kw), D.DistributedSampler(range(n), **kw)
            t.set_epoch(epoch)
            f.set_epoch(epoch)
            assert list(f) == list(t) and len(f) == len(t)


def test_distributed_sampler_defaults_and_errors():
    s = D.DistributedSampler(range(10))
    assert (s.num_replicas, s.rank) == (flow.env.get_world_size(), flow.env.get_rank())
    with pytest.raises(ValueError, match="invalid rank"):
        D.DistributedSampler(range(10), num_replicas=2, rank=2)


def _seeded_init(worker_id):
    np.random.seed(1000 + worker_id)


class Noisy(D.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        info = D.get_worker_info()
        return {"i": i, "worker": -1 if info is None else info.id, "r": float(np.random.rand())}


def test_workers_give_the_same_batches_as_main_process():
    kw = dict(batch_size=4, shuffle=True)
    flow.manual_seed(9)
    ref = list(D.DataLoader(Items(), **kw))
    flow.manual_seed(9)
    got = list(D.DataLoader(Items(), num_workers=2, **kw))
    assert len(got) == len(ref)
    for a, b in zip(ref, got):
        assert isinstance(b["x"], flow.Tensor) and torch.equal(a["x"].to_torch(), b["x"].to_torch())
        assert a["y"].tolist() == b["y"].tolist() and a["name"] == b["name"]


def test_workers_init_fn_info_and_persistent():
    loader = D.DataLoader(Noisy(), batch_size=3, num_workers=2, worker_init_fn=_seeded_init,
                          persistent_workers=True)
    for _ in range(2):
        batches = list(loader)
        assert [b["i"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
        assert [b["worker"].tolist()[0] for b in batches] == [0, 1, 0, 1]
    loader._workers_iter.shutdown()
    first = np.random.RandomState(1000).rand()
    assert list(D.DataLoader(Noisy(), batch_size=3, num_workers=2, worker_init_fn=_seeded_init))[0]["r"][0].item() \
        == first


def test_iterable_dataset_with_and_without_workers():
    one = [b.tolist() for b in D.DataLoader(Stream(), batch_size=4)]
    assert one == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]
    two = [b.tolist() for b in D.DataLoader(Stream(), batch_size=4, num_workers=2)]
    assert sorted(sum(two, [])) == list(range(20)) and len(two) == 6


class Broken(D.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            raise KeyError("bad sample 2")
        return i


def test_worker_errors_are_reraised():
    with pytest.raises(KeyError, match="bad sample 2"):
        list(D.DataLoader(Broken(), batch_size=1, num_workers=2))
    with pytest.raises(KeyError, match="bad sample 2"):
        list(D.DataLoader(Broken(), batch_size=1))


def test_custom_collate_batch_sampler_and_no_batching():
    loader = D.DataLoader(Items(), batch_sampler=[[0, 5], [7]], collate_fn=lambda b: [s["y"] for s in b])
    assert list(loader) == [[0, 5], [7]]
    single = list(D.DataLoader(Items(), batch_size=None, num_workers=2))
    assert len(single) == N and isinstance(single[4]["x"], flow.Tensor) and single[4]["y"] == 4
    with pytest.raises(ValueError, match="mutually exclusive"):
        D.DataLoader(Items(), batch_sampler=[[0]], batch_size=2)
    assert list(D.DataLoader(Items(), batch_size=2, pin_memory=True))[0]["y"].tolist() == [0, 1]
