"""``holoflow.futures`` (torch.futures under mock_torch) against torch's own Future: the same
chains give the same values and the same errors."""
import pytest
import torch

import holoflow as flow
from holoflow import mock_torch


@pytest.mark.parametrize("lib", [torch, flow], ids=["torch", "holoflow"])
def test_future_chains_values_errors_and_collections(lib):
    f = lib.futures.Future()
    seen = []
    f.add_done_callback(lambda fut: seen.append(fut.value()))
    chained = f.then(lambda fut: fut.value() * 2).then(lambda fut: fut.value() + 1)
    assert not f.done()
    f.set_result(5)
    assert f.done() and f.wait() == 5 and chained.wait() == 11 and seen == [5]
    with pytest.raises(RuntimeError):
        f.set_result(6)   # (completed once)
    bad = lib.futures.Future()
    failing = bad.then(lambda fut: fut.value())
    bad.set_exception(ValueError("producer failed"))
    with pytest.raises(ValueError, match="producer failed"):
        bad.wait()
    with pytest.raises(RuntimeError, match="running the callback: ValueError: producer failed"):
        failing.wait()
    parts = [lib.futures.Future() for _ in range(3)]
    for i, p in enumerate(parts):
        p.set_result(i * 10)
    assert [p.value() for p in lib.futures.collect_all(parts).wait()] == [0, 10, 20]
    assert lib.futures.wait_all(parts) == [0, 10, 20]


def test_future_is_subscriptable_in_annotations_under_mock():
    with mock_torch.enable():
        import torch as t

        def hook(state, bucket) -> t.futures.Future[t.Tensor]:
            return None
        assert t.futures.Future is flow.futures.Future and hook(None, None) is None
