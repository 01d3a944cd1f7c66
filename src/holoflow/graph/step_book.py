"""Step accounting of the optimizer inside a graph: a graph step counts as one eager
``opt.step()`` (``opt._step_count``, which LR schedulers' order check and step hooks read), though
it runs one update kernel per parameter group and placement (pipeline stages), under gradient
accumulation once per call, under ZeRO or a grad scaler alike."""
from __future__ import annotations


def count_step(opt) -> None:
    """What eager's ``opt.step()`` books once per call, whatever its parameter groups: the step
    count (``opt._step_count``, read by LR schedulers' order check and by step hooks) and the
    "stepped" flag."""
    opt._step_count = getattr(opt, "_step_count", 0) + 1
    opt._opt_called = True


class StepBook:
    """Books one step of ``opt`` (`count_step`) per graph step, though a step runs one update
    kernel per parameter group and placement: the update kernels of one trace share a book, each
    counts its own runs, and the first to run for the n-th time books step n. A step that runs no
    update (a grad scaler skipping it) books none, as eager's skipped ``opt.step()``; the kernels
    a pass or a pipeline stage makes from an update keep its book."""

    def __init__(self, opt) -> None:
        self.opt, self.booked = opt, 0

    def ran(self, runs: int) -> None:
        """An update kernel of this book ran for the ``runs``-th time."""
        if runs > self.booked:
            self.booked = runs
            count_step(self.opt)


def booking(book: StepBook | None):
    """The run counter of one update kernel: call it after each of its runs."""
    runs = 0

    def ran() -> None:
        nonlocal runs
        runs += 1
        if book is not None:
            book.ran(runs)
    return ran
