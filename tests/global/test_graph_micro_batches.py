"""Gradient accumulation on global graphs (micro-batches as runtime iterations) against torch on
one process: every input of a call gives micro-batch ``k`` the same rows of the batch, whatever
its SBP (a broadcast label beside an ``S(0)`` batch used to take other rows than the batch: wrong
losses and gradients, silently); outputs come back with their rows where they were; inputs that
cut dim 0 into other blocks are refused before anything runs; and a forward's in-place write
never overwrites a value the micro-batch's backward still reads (the memory plan's in-place
square clobbered the activation the backward re-read: wrong gradients, silently). Two pipeline
stages with activation checkpointing equal torch under every schedule."""
import pytest
import torch

import micro_fns as F
from holoflow.core.errors import HoloflowError
from holoflow.distributed import world
from holoflow.sbp import B, P, S



def _each_rank_equals(results, want) -> None:
    """Every rank's results (a list per rank) equal the single-process torch program's."""
    for got in results:
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

def _check_labels(results, m: int, shards: int) -> None:
    want_losses, want_logits, want_w = F.torch_label_steps(m, shards)
    xs, _, _ = F.data(m)
    for steps, w in results:
        for (loss, logits, x), wl, wlog, xin in zip(steps, want_losses, want_logits, xs):
            torch.testing.assert_close(loss, torch.tensor(wl))
            torch.testing.assert_close(logits, wlog, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(x, xin)
        torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("y_sbp", [B, S(0)], ids=["B", "S0"])
@pytest.mark.parametrize("x_sbp", [B, S(0)], ids=["B", "S0"])
def test_labels_meet_their_rows_simulated(x_sbp, y_sbp):
    m = 2
    res = world.simulate(2, lambda r: F.label_steps(r, m, [0, 1], x_sbp, y_sbp), timeout=120)
    shards = 2 if S(0) in (x_sbp, y_sbp) else 1
    _check_labels(res, m, shards)


def test_broadcast_label_beside_split_batch_on_gloo(world2):
    _check_labels(world2.run(F.label_steps, 2, [0, 1], S(0), B), 2, 2)


def test_broadcast_label_beside_split_batch_on_a_2x2_mesh_gloo(world4):
    """``(S(0), S(0))``: four blocks of two rows, each cut in two micro-batches of one row."""
    _check_labels(world4.run(F.label_steps, 2, [[0, 1], [2, 3]], [S(0), S(0)], [B, B]), 2, 4)


def test_partial_label_free_input_beside_split_batch():
    """A partial-sum batch beside a split label: the partial pieces take the label's rows."""
    res = world.simulate(2, lambda r: F.label_steps(r, 2, [0, 1], P, S(0)), timeout=120)
    _check_labels(res, 2, 2)


def test_inputs_splitting_rows_into_other_blocks_are_refused():
    """``(S(0), B)`` cuts 8 rows into 2 blocks, ``(S(0), S(0))`` into 4: a micro-batch would pair
    rows of the batch with other rows of the labels."""
    def run(rank):
        return F.label_steps(rank, 2, [[0, 1], [2, 3]], [S(0), B], [S(0), S(0)])
    with pytest.raises(RuntimeError, match=r"input 0 .*sbp \(S\(0\), B\).*input 1 .*sbp \(S\(0\), S\(0\)\).*"
                                           r"same dim-0 split") as e:
        world.simulate(4, run, timeout=120)
    assert isinstance(e.value.__cause__, HoloflowError)


def test_forward_inplace_never_clobbers_what_backward_reads_simulated():
    want = F.torch_square_loss_steps(2, lr_by_step=True)
    _each_rank_equals(world.simulate(2, lambda r: F.square_loss_steps(r, 2, lr_by_step=True), timeout=120), want)
    _each_rank_equals([F.square_loss_steps(None, 2, lr_by_step=True)], want)   # the local graph: grad_acc pass


def test_forward_inplace_never_clobbers_what_backward_reads_on_gloo(world2):
    want = F.torch_square_loss_steps(4)
    _each_rank_equals(world2.run(F.square_loss_steps, 4), want)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
def test_two_stage_pipeline_with_checkpointing_equals_torch_simulated(schedule, checkpointing):
    want = F.torch_two_stage_square(4)
    _each_rank_equals(world.simulate(2, lambda r: F.two_stage_square(r, 4, checkpointing, schedule), timeout=120), want)


def test_two_stage_pipeline_with_checkpointing_equals_torch_on_gloo(world2):
    want = F.torch_two_stage_square(4)
    _each_rank_equals(world2.run(F.two_stage_square, 4, True), want)


def test_an_output_splitting_rows_into_other_blocks_is_refused_before_running():
    """The batch is ``(S(0), B)`` (2 blocks of rows); an output ``(S(0), S(0))`` (4 blocks) packed
    per rank would come back with its rows out of order: refused, before any step runs."""
    import holoflow as flow

    def run(rank):
        place = flow.placement("cpu", [[0, 1], [2, 3]])
        w = flow.nn.Parameter(flow.ones(6, 5, placement=place, sbp=[B, B]))
        mod = flow.nn.Module()
        mod.w = w
        opt = flow.optim.SGD([w], lr=0.1)

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.mod = mod
                self.add_optimizer(opt)
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x):
                y = x @ self.mod.w
                y.sum().backward()
                return y.to_global(sbp=[S(0), S(0)])
        x = flow.ones(8, 6, placement=place, sbp=[S(0), B])
        try:
            Train()(x)
        finally:
            assert float(w.to_global(sbp=[B, B]).to_local().sum()) == 30.0   # no step ran
    with pytest.raises(RuntimeError, match=r"output 0 .*sbp \(S\(0\), S\(0\)\).*splits dim 0 into other blocks"):
        world.simulate(4, run, timeout=120)


def test_outputs_not_batch_long_come_back_in_micro_batch_order():
    """A per-micro-batch vector of another length than the micro-batch (``x.mean(0)``, partial
    sums) is concatenated in micro-batch order (OneFlow's pack); a broadcast copy of the batch
    comes back row for row."""
    import holoflow as flow
    x0 = torch.randn(8, 6, generator=torch.Generator().manual_seed(5))

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.nn.Parameter(flow.ones(6, 3, placement=place, sbp=B))
        mod = flow.nn.Module()
        mod.w = w
        opt = flow.optim.SGD([w], lr=0.0)

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.mod = mod
                self.add_optimizer(opt)
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x):
                (x @ self.mod.w).sum().backward()
                return x.mean(0), x.to_global(sbp=B)
        means, whole = Train()(flow.from_torch(x0).to_global(place, B).to_global(sbp=S(0)))
        return [t.to_global(sbp=B).to_local().to_torch() for t in (means, whole)]
    want = torch.cat([x0[F.micro_rows(8, 2, 2, k)].mean(0) for k in range(2)])
    for means, whole in world.simulate(2, run, timeout=120):
        torch.testing.assert_close(means, want)
        torch.testing.assert_close(whole, x0)


@pytest.mark.parametrize("label", ["S0", "B"])
def test_data_parallel_stages_pair_labels_on_another_placement_simulated(label):
    """The batch on stage 0's ranks, the labels on stage 1's: a broadcast label takes the rows the
    batch's shards cut on the other placement."""
    want = F.torch_dp_stages(2)
    sbp = S(0) if label == "S0" else B
    _each_rank_equals(world.simulate(4, lambda r: F.dp_stages(r, 2, sbp), timeout=120), want)


def test_data_parallel_stages_with_a_broadcast_label_on_gloo(world4):
    want = F.torch_dp_stages(2)
    _each_rank_equals(world4.run(F.dp_stages, 2, B), want)


def test_an_output_computed_once_per_step_after_backward_is_refused_clearly():
    """``clip_grad_norm_``'s total norm returned from build under micro-batches of a global graph
    (computed from the summed gradients, once per step) used to fail with a bare ``KeyError``."""
    import holoflow as flow

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        lin = flow.nn.Linear(6, 3).to_global(place, B)
        opt = flow.optim.SGD(lin.parameters(), lr=0.1)

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.lin = lin
                self.add_optimizer(opt)
                self.config.set_gradient_accumulation_steps(2)

            def build(self, x):
                self.lin(x).pow(2).mean().backward()
                return flow.nn.utils.clip_grad_norm_(self.lin.parameters(), 0.1)
        Train()(flow.ones(8, 6, placement=place, sbp=S(0)))
    with pytest.raises(RuntimeError, match=r"output 0 of build\(\) \(computed at test_graph_micro_batches.py:\d+ .*"
                                           r"once per step; with gradient accumulation \(m=2\)"):
        world.simulate(2, run, timeout=60)
