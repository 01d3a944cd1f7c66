"""Every op in the registry has SBP signatures validated by some op-table case (forward or grad
dispatch). A missing rule or an op no case reaches is reported by name, never skipped."""
import importlib
import pkgutil

import ops as ops_tests
from harness import record_ops

from holoflow.core.registry import REGISTRY

# Ops no eager op-table case can reach, each with the reason and where it is tested instead.
NOT_IN_OP_TABLES = {
    "box": "boxing itself: tests/global (every 1-D/2-D pair, simulated and on Gloo)",
    "global_box": "a global graph's boxing node (the same collectives as box): tests/global/test_global_graph.py",
    "global_box_bucket": "a global graph's bucket of gradient all-reduces: tests/global/test_global_graph.py",
    "global_box_issue": "a localized global graph's collective started now (async): tests/global/test_graph_async_comm.py",
    "global_box_wait": "the wait for an issued collective at its first reader: tests/global/test_graph_async_comm.py",
    "global_tag": "a global graph's broadcast tag of an identical local value: tests/global/test_global_graph.py",
    "move": "a move between placements: tests/global/test_one_program.py, test_moves_and_errors.py",
    "move_idle": "a move on a rank in neither placement: tests/global/test_one_program.py",
    "global_alias": "to_local / a no-op to_global of a leaf: tests/global/test_one_program.py",
    "absent": "an op skipped on a rank outside its placement: tests/global/test_one_program.py",
    "from_local": "a local tensor made global: tests/global/test_one_program.py",
    "to_local_as": "torch's DTensor.to_local (its gradient laid out as told): tests/global/test_dtensor.py",
    "stage_move": "a graph's move between pipeline stages (send/recv tasks): tests/global/test_pipeline_stages.py",
    "view_read": "a local in-place write into overlapping windows (unfold's) reading them: tests/test_views_inplace.py, "
                 "tests/graph/test_graph_overlapping_writes.py",
    "written_values": "a traced local write into overlapping windows: tests/graph/test_graph_overlapping_writes.py",
    "zero_grads": "an in-place comparison's result while autograd records (local): tests/test_views_inplace.py",
}
# Random ops: the in-place fills take the in-place kernel path (no dispatch to record) and
# attention dropout's cases run with sbp=False; values are seed-dependent, so their tests
# (tests/ops/test_random.py, test_nn_ops.py) compare them with torch under one seed. Their
# signatures come from the elementwise family / sdpa's rule, checked on the other members here.
RANDOM_FILLS = {"bernoulli_", "exponential_", "normal_", "random_", "uniform_", "cauchy_", "log_normal_",
                "geometric_", "scaled_dot_product_attention_dropout"}


def _modules():
    for info in pkgutil.iter_modules(ops_tests.__path__):
        if info.name.startswith("test_") and info.name != "test_sbp_coverage":
            mod = importlib.import_module(f"ops.{info.name}")
            if hasattr(mod, "CASES"):
                yield mod


def test_every_registered_op_has_validated_signatures():
    seen = set()
    for mod in _modules():
        for case in mod.CASES:
            if case.sbp:
                seen.update(op.name for op, _, _ in record_ops(case))
    without_rule = sorted(op.name for op in REGISTRY.values() if op.sbp is None and op.name not in NOT_IN_OP_TABLES)
    assert not without_rule, f"ops without an SBP rule: {without_rule}"
    unreached = sorted(name for name, op in REGISTRY.items()
                       if name not in seen and name not in NOT_IN_OP_TABLES and name not in RANDOM_FILLS
                       and op.family != "creation")
    assert not unreached, f"ops whose SBP signatures no op-table case validates: {unreached}"
