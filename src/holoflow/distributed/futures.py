"""torch's ``torch.futures`` (what mock_torch gives for it, through ``holoflow.futures``): a value
that may not be there yet. ``Work.get_future()`` of an asynchronous collective and a DDP
communication hook return one; its value is computed when someone waits for it (the collective
waited for, then each ``then`` callback run once, in order)."""
from __future__ import annotations

from typing import Any, Callable, Generic, Iterable, TypeVar

__all__ = ["Future", "collect_all", "wait_all"]

T = TypeVar("T")
_UNSET = object()


class Future(Generic[T]):
    """torch's ``Future``: ``wait()`` returns the value (raising what the producer raised),
    ``then(fn)`` is a future of ``fn(this future)``, ``set_result`` completes one made empty."""

    def __init__(self, *, devices: Any = None) -> None:
        self._value: Any = _UNSET
        self._error: BaseException | None = None
        self._produce: Callable[[], Any] | None = None
        self._callbacks: list = []

    @classmethod
    def _of(cls, produce: Callable[[], Any]) -> "Future":
        """A future whose value ``produce()`` computes on the first wait."""
        fut = cls()
        fut._produce = produce
        return fut

    @classmethod
    def _completed(cls, value: Any) -> "Future":
        fut = cls()
        fut._value = value
        return fut

    def done(self) -> bool:
        return self._value is not _UNSET or self._error is not None

    def wait(self) -> T:
        if not self.done():
            if self._produce is None:
                raise RuntimeError("holoflow Future.wait: the future has no value yet and nothing produces one; "
                                   "complete it with set_result() first")
            produce, self._produce = self._produce, None
            try:
                self._finish(produce(), None)
            except BaseException as e:  # kept: every later wait raises it too, as torch's
                self._finish(_UNSET, e)
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> T:
        """The value (waiting for it if it is not there yet)."""
        return self.wait()

    def then(self, callback: Callable[["Future[T]"], Any]) -> "Future":
        """A future of ``callback(this future)``, run once this one completes (failed too: its
        ``value()`` raises inside the callback); what the callback raises is a RuntimeError
        naming it, as torch's."""
        def produce() -> Any:
            try:
                self.wait()
            except BaseException:   # noqa: BLE001 - the callback sees it through value()
                pass
            try:
                return callback(self)
            except Exception as e:
                raise RuntimeError(f"Got the following error when running the callback: "
                                   f"{type(e).__name__}: {e}") from e
        return Future._of(produce)

    def add_done_callback(self, callback: Callable[["Future[T]"], None]) -> None:
        if self.done():
            callback(self)
        else:
            self._callbacks.append(callback)

    def set_result(self, result: T) -> None:
        if self.done():
            raise RuntimeError("holoflow Future.set_result: the future is already completed")
        self._finish(result, None)

    def set_exception(self, result: BaseException) -> None:
        if self.done():
            raise RuntimeError("holoflow Future.set_exception: the future is already completed")
        self._finish(_UNSET, result)

    def _finish(self, value: Any, error: BaseException | None) -> None:
        self._value, self._error = value, error
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)


def collect_all(futures: Iterable[Future]) -> Future:
    """A future of the list of ``futures``, complete when all of them are."""
    futures = list(futures)

    def produce() -> list:
        wait_all(futures)
        return futures
    return Future._of(produce)


def wait_all(futures: Iterable[Future]) -> list:
    """Every future's value, in order."""
    return [f.wait() for f in futures]
