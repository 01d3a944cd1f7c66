"""The recorded torch outputs (tests/torch_outputs.py, tests/torch_reference/) cannot go stale
silently: an entry serves only the exact program text, harness text, world size, torch and machine
it was recorded from; anything else runs torch live, and the committed entries are torch's own."""
import json
import re
import warnings

import pytest
import test_dtensor_api as harness
import torch_outputs
from test_torch_distributed_api import COLLECTIVES_WITH_GRAD

NAME = "basics-2"
RUN = [{"x": [1.0]}, {"x": [2.0]}]


def _record(monkeypatch, name: str, parts: dict, outputs=RUN):
    """Records ``outputs`` as the entry's (in the test's own store)."""
    monkeypatch.setenv(torch_outputs.RECORD_VAR, "1")
    got = torch_outputs.recorded(name, parts, lambda: outputs)
    monkeypatch.delenv(torch_outputs.RECORD_VAR)
    return got


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An empty store in tmp_path (the committed one untouched), entry names free again."""
    monkeypatch.setattr(torch_outputs, "STORE", tmp_path)
    monkeypatch.setattr(torch_outputs, "_NAMED", {})
    return tmp_path


def test_every_character_of_the_program_and_its_harness_is_in_the_key(store, monkeypatch):
    text = harness.script_text(harness.BASICS)
    parts = harness.launch_parts(text, 2)
    _record(monkeypatch, NAME, parts)
    assert torch_outputs.lookup(NAME, parts) == RUN
    for i in range(len(text)):   # a one-character change anywhere in the script misses
        changed = text[:i] + ("#" if text[i] != "#" else "%") + text[i + 1:]
        assert torch_outputs.lookup(NAME, {**parts, "script": changed}) is None, (i, text[i])
    h = parts["harness"]
    for i in range(0, len(h), 7):
        assert torch_outputs.lookup(NAME, {**parts, "harness": h[:i] + h[i + 1:]}) is None, (i, h[i])
    assert torch_outputs.lookup(NAME, harness.launch_parts(text, 4)) is None
    assert torch_outputs.lookup(NAME, harness.launch_parts(text + "\n", 2)) is None


# two values of each part of the machine's key (one of them is not this machine's)
OTHER = {"torch": ("2.13.1+cpu", "2.13.0+cpu"), "cpu_vendor": ("AuthenticAMD", "GenuineIntel"),
         "cpu_capability": ("AVX2", "AVX512"), "python": ("3.12", "3.11"),
         "env": ({"ATEN_CPU_CAPABILITY": "avx2"}, {})}


def _another(here: dict, what: str):
    """A value of the machine's key part ``what`` other than this machine's."""
    return next(v for v in OTHER[what] if v != here[what])


@pytest.mark.parametrize("what", OTHER)
def test_another_torch_or_machine_misses(store, monkeypatch, what):
    parts = harness.launch_parts(harness.script_text(harness.BASICS), 2)
    _record(monkeypatch, NAME, parts)
    here = torch_outputs.machine()
    other = _another(here, what)
    monkeypatch.setattr(torch_outputs, "machine", lambda: {**here, what: other})
    assert torch_outputs.lookup(NAME, parts) is None


def test_a_miss_runs_torch_live_says_so_and_writes_nothing(store):
    parts = harness.launch_parts(harness.script_text(harness.BASICS), 2)
    with pytest.warns(torch_outputs.TorchRanLive, match=f"torch ran live for '{NAME}': nothing recorded.*"
                      "HOLOFLOW_RECORD_TORCH=1"):
        assert torch_outputs.recorded(NAME, parts, lambda: RUN) == RUN
    assert list(store.iterdir()) == []


def test_a_miss_says_why(store, monkeypatch):
    parts = harness.launch_parts(harness.script_text(harness.BASICS), 2)
    _record(monkeypatch, NAME, parts)
    monkeypatch.setattr(torch_outputs, "_NAMED", {})
    with pytest.warns(torch_outputs.TorchRanLive, match="program, harness or world size changed"):
        torch_outputs.recorded(NAME, {**parts, "world_size": 4}, lambda: RUN)
    here = torch_outputs.machine()
    monkeypatch.setattr(torch_outputs, "machine", lambda: {**here, "torch": "2.14.0+cpu"})
    monkeypatch.setattr(torch_outputs, "_NAMED", {})
    with pytest.warns(torch_outputs.TorchRanLive, match=re.escape(f"another torch or machine (torch: {here['torch']!r} "
                                                                  "there, '2.14.0+cpu' here)")):
        torch_outputs.recorded(NAME, parts, lambda: RUN)


def test_recording_keeps_other_machines_entries_and_drops_other_texts(store, monkeypatch):
    parts = harness.launch_parts(harness.script_text(harness.BASICS), 2)
    _record(monkeypatch, NAME, parts)
    here = torch_outputs.machine()
    other = _another(here, "cpu_vendor")
    monkeypatch.setattr(torch_outputs, "machine", lambda: {**here, "cpu_vendor": other})
    monkeypatch.setattr(torch_outputs, "_NAMED", {})
    _record(monkeypatch, NAME, parts, [{"x": [3.0]}])
    assert len(json.loads((store / f"{NAME}.json").read_text())["entries"]) == 2
    assert torch_outputs.lookup(NAME, parts) == [{"x": [3.0]}]
    monkeypatch.setattr(torch_outputs, "machine", lambda: here)
    assert torch_outputs.lookup(NAME, parts) == RUN
    monkeypatch.setattr(torch_outputs, "_NAMED", {})
    edited = harness.launch_parts(harness.script_text(harness.BASICS + "x = 1\n"), 2)
    _record(monkeypatch, NAME, edited)
    assert len(json.loads((store / f"{NAME}.json").read_text())["entries"]) == 1
    assert torch_outputs.lookup(NAME, parts) is None and torch_outputs.lookup(NAME, edited) == RUN


def test_two_programs_may_not_share_an_entry(store):
    one = harness.launch_parts(harness.script_text(harness.BASICS), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch_outputs.TorchRanLive)
        torch_outputs.recorded(NAME, one, lambda: RUN)
        with pytest.raises(ValueError, match="two programs share the torch_reference entry 'basics-2'"):
            torch_outputs.recorded(NAME, harness.launch_parts(harness.script_text(harness.TP_MLP), 2), lambda: RUN)


def test_the_committed_entries_are_well_formed_and_keyed_by_their_text():
    entries = {f.stem: json.loads(f.read_text())["entries"] for f in torch_outputs.STORE.glob("*.json")}
    assert entries and all(set(e) == {"key", "program", "machine", "outputs"} for es in entries.values() for e in es)
    text = harness.script_text(harness.BASICS)
    parts = harness.launch_parts(text, 2)
    if torch_outputs.lookup(NAME, parts) is not None:   # (recorded on a machine like this one)
        i = text.index("arange(24.0)")
        assert torch_outputs.lookup(NAME, {**parts, "script": text[:i] + "arange(25.0)" + text[i + 12:]}) is None


def test_a_committed_entry_is_torchs_live_run(tmp_path):
    """One committed entry (differentiable collectives, among the quickest) against torch run now,
    where this machine has one: the store holds torch's own outputs."""
    parts = harness.launch_parts(COLLECTIVES_WITH_GRAD, 2)
    stored = torch_outputs.lookup("collectives_with_grad-2", parts)
    if stored is None:
        pytest.skip("no entry for this machine: the tests run torch live here")
    assert harness._launch(tmp_path, "torch", "collectives_with_grad", COLLECTIVES_WITH_GRAD, 2) == stored
