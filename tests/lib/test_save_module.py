"""``holoflow.save(model)``: a whole module round-trips with weights_only=False (as torch.load),
and weights_only=True refuses it with torch's exception class, naming the class and what to do."""
import pickle

import pytest
import torch

import holoflow as flow
from holoflow import mock_torch


class Net(flow.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.emb = flow.nn.Embedding(10, 4)
        self.head = flow.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight          # tied
        self.norm = flow.nn.BatchNorm1d(3)
        self.register_buffer("scale", flow.ones(1) * 2)

    def forward(self, idx):
        return self.head(self.norm(self.emb(idx)) * self.scale)


def test_whole_module_round_trip(tmp_path):
    flow.manual_seed(0)
    m = Net(7)
    m.norm(flow.randn(5, 3, 4))   # running stats != defaults
    path = tmp_path / "m.hf"
    flow.save(m, path)
    with pytest.raises(pickle.UnpicklingError, match=r"whole module \(.*Net\).*weights_only=False"):
        flow.load(path)
    m2 = flow.load(path, weights_only=False)
    assert type(m2) is Net and m2.n == 7 and m2.head.weight is m2.emb.weight
    assert isinstance(m2.emb.weight, flow.nn.Parameter) and m2.emb.weight.requires_grad
    for (k, v), (k2, v2) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert k == k2 and torch.equal(v.to_torch(), v2.to_torch())
    idx = flow.tensor([[1, 2, 3]])
    m.eval()
    m2.eval()
    assert torch.equal(m(idx).to_torch(), m2(idx).to_torch())
    m2(idx).sum().backward()
    assert m2.emb.weight.grad is not None


def test_module_inside_a_dict_and_under_mock_torch(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    g = {"__name__": "user_script", "path": path}
    with mock_torch.enable():
        exec("import torch\nm = torch.nn.Linear(3, 2)\ntorch.save({'model': m, 'step': 3}, path)\n"
             "ck = torch.load(path, weights_only=False)\n", g)
    assert g["ck"]["step"] == 3
    assert torch.equal(g["ck"]["model"].weight.to_torch(), g["m"].weight.to_torch())


def test_unpicklable_module_says_what_to_do(tmp_path):
    m = flow.nn.Linear(2, 2)
    m.fn = lambda x: x
    with pytest.raises(TypeError, match=r"cannot be saved whole.*state_dict\(\)"):
        flow.save(m, tmp_path / "x.hf")
