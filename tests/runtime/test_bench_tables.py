"""bench/run_all.py's runtime table reads both of bench/runtime.py's fields: the chain rows
(``us_per_act``) and the GPT-mini plan rows (``us_per_call``, the runtime's cost per training step)."""
from __future__ import annotations

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "run_all.py")


def _run_all():
    spec = importlib.util.spec_from_file_location("holoflow_bench_run_all", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runtime_rows_report_per_call_overhead() -> None:
    rows = _run_all().runtime_rows({
        "us_per_act": {"sequential executor": 0.5, "actors, caller thread": 2.0},
        "us_per_call": {"gpt plan, sequential executor": 4.0, "gpt plan, actors, caller thread": 10.0}})
    text = "\n".join(rows)
    assert "| chain of 8 trivial tasks: actors, caller thread | us/act | 2.00 | 4.0 | 1.50 |" in text
    assert "| GPT-mini plan, trivial fns: gpt plan, actors, caller thread | us/call | 10.00 | 2.5 | 6.00 |" in text


def test_runtime_rows_without_results() -> None:
    assert _run_all().runtime_rows({"us_per_act": {}, "us_per_call": {}}) == ["(bench/runtime.py failed)"]
