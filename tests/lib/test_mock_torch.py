"""mock_torch: `import torch` code runs on holoflow; disable restores the real torch."""
import importlib
import sys

import pytest
import torch as real_torch

import holoflow as flow
from holoflow import mock_torch

SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import torch.optim
from torch.optim.lr_scheduler import StepLR

x = torch.tensor([[1.0, -2.0], [3.0, -4.0]])
y = F.relu(x)
w = torch.ones(2, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.5)
(x * w).relu().sum().backward()
opt.step()
batches = list(DataLoader(TensorDataset(x), batch_size=1))
is_tensor = isinstance(y, torch.Tensor)
"""


def _run(script):
    g = {"__name__": "user_script"}
    exec(compile(script, "<user script>", "exec"), g)
    return g


def test_script_resolves_to_holoflow():
    with mock_torch.enable():
        assert mock_torch.is_enabled()
        g = _run(SCRIPT)
    assert not mock_torch.is_enabled()
    assert g["torch"] is not real_torch and g["torch"].Tensor is flow.Tensor
    assert isinstance(g["y"], flow.Tensor) and g["y"].tolist() == [[1.0, 0.0], [3.0, 0.0]]
    assert g["F"].relu is flow.nn.functional.relu and g["nn"].Module is flow.nn.Module
    assert g["DataLoader"] is flow.utils.data.DataLoader and g["StepLR"] is flow.optim.lr_scheduler.StepLR
    assert isinstance(g["opt"], flow.optim.SGD) and g["w"].tolist() == [-1.0, 1.0]
    assert g["is_tensor"] and len(g["batches"]) == 2


def test_disable_restores_real_torch():
    mock_torch.enable()
    try:
        assert _run("import torch")["torch"] is not real_torch
    finally:
        mock_torch.disable()
    g = _run("import torch\nimport torch.nn.functional as F")
    assert g["torch"] is real_torch and g["F"] is real_torch.nn.functional
    assert sys.modules["torch"] is real_torch
    assert importlib.import_module("torch") is real_torch


def test_disable_as_context_manager_reenables():
    with mock_torch.enable():
        with mock_torch.disable():
            assert _run("import torch")["torch"] is real_torch
        assert _run("import torch")["torch"] is not real_torch
    assert _run("import torch")["torch"] is real_torch


def test_missing_attribute_and_module_name_them():
    with mock_torch.enable():
        with pytest.raises(AttributeError, match=r"holoflow \(mock_torch\): torch.not_a_thing is not implemented"):
            _run("import torch\ntorch.not_a_thing")
        with pytest.raises(AttributeError, match=r"torch.nn.NotALayer is not implemented in holoflow"):
            _run("import torch.nn as nn\nnn.NotALayer")
        with pytest.raises(ModuleNotFoundError, match=r"torch.no_such_module is not implemented in holoflow"):
            _run("import torch.no_such_module")
        assert importlib.import_module("torch.optim").SGD is flow.optim.SGD


def test_holoflow_keeps_real_torch_under_the_mock():
    with mock_torch.enable():
        t = flow.tensor([1.0, 2.0])            # torch's C++ imports torch internally
        assert isinstance(t.to_torch(), real_torch.Tensor)
        g = _run("import torch\nv = torch.randn(3)")
        assert isinstance(g["v"], flow.Tensor)
        ns = {"__name__": "holoflow._probe"}    # an import made from inside holoflow
        exec("import torch\nimport torch.nn.functional as F", ns)
        assert ns["torch"] is real_torch and ns["F"] is real_torch.nn.functional
        assert flow.load is not None and sys.modules["torch"] is real_torch


def test_patching_through_the_mock_restores_torchs_attribute():
    """``unittest.mock.patch("torch.cuda.set_rng_state", f)`` under the mock (AOTAutograd does it
    while Inductor compiles) sets torch's attribute through holoflow's module and, on exit,
    deletes what it set and restores the original; a missing ``__delattr__`` raised on exit and
    left torch.cuda.set_rng_state a no-op for the rest of the process."""
    from unittest import mock
    original = real_torch.cuda.set_rng_state
    with mock_torch.enable():
        with mock.patch("torch.cuda.set_rng_state", lambda *args: None):
            assert real_torch.cuda.set_rng_state is not original
        gelu = flow.nn.functional.gelu
        with mock.patch("torch.nn.functional.gelu", lambda x: x):   # (a holoflow module's own function)
            assert flow.nn.functional.gelu is not gelu
    assert real_torch.cuda.set_rng_state is original and flow.nn.functional.gelu is gelu


def test_torch_compile_under_the_mock_compiles_with_inductor(recwarn):
    """torch.compile under the mock is holoflow.compile, whose tasks Inductor compiles (it fell
    back to uncompiled tasks on every call: AOTAutograd's patch of torch.cuda raised)."""
    from holoflow.graph import compile_tasks
    states = []
    orig = compile_tasks.CompiledTask._compile

    def seen(self, args):
        got = orig(self, args)
        states.append(self.state)
        return got
    with mock_torch.enable(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(compile_tasks.CompiledTask, "_compile", seen)
        g = _run("import torch\nm = torch.nn.Linear(3, 2)\nf = torch.compile(m)\n"
                 "x = torch.ones(4, 3)\nf(x).sum().backward()\nwant = m(x)\ngot = f(x)\n")
    assert states and set(states) == {"compiled"}, states
    assert not [w for w in recwarn if "cannot compile" in str(w.message)]
    flow.testing.assert_close(g["got"], g["want"])
