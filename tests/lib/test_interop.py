"""Interop: numpy round trips, torch, DLPack."""
import numpy as np
import torch

import holoflow as flow
from holoflow.utils import dlpack


def test_numpy_round_trips_share_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = flow.from_numpy(a)
    assert t.dtype == flow.float32 and t.shape == (2, 3)
    a[0, 0] = 42
    assert t.tolist()[0][0] == 42
    back = t.numpy()
    assert back.dtype == np.float32 and np.array_equal(back, a)
    assert np.array_equal(np.asarray(t), a) and np.asarray(t, dtype=np.float64).dtype == np.float64
    for dt in (np.int64, np.bool_, np.float64, np.uint8):
        x = np.ones(3, dtype=dt)
        assert flow.from_numpy(x).numpy().dtype == x.dtype


def test_torch_round_trip():
    x = torch.randn(3)
    t = flow.from_torch(x)
    x[0] = 7.0
    assert t.tolist()[0] == 7.0
    assert t.to_torch().data_ptr() == x.data_ptr()
    r = flow.ones(2, requires_grad=True)
    assert not r.to_torch().requires_grad


def test_dlpack_round_trip():
    t = flow.arange(4, dtype=flow.float32)
    capsule = dlpack.to_dlpack(t)
    back = dlpack.from_dlpack(capsule)
    assert isinstance(back, flow.Tensor) and back.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert back.data_ptr() == t.data_ptr()
    tt = torch.from_dlpack(t)                       # holoflow tensors speak __dlpack__
    assert tt.data_ptr() == t.data_ptr()
    n = np.from_dlpack(t)
    assert n.tolist() == [0.0, 1.0, 2.0, 3.0]
    from_np = dlpack.from_dlpack(np.arange(3.0))
    assert from_np.tolist() == [0.0, 1.0, 2.0] and flow.from_dlpack(torch.ones(2)).tolist() == [1.0, 1.0]
