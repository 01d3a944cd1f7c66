"""``holoflow.utils.convert``: a holoflow checkpoint becomes a torch.load-able file and back, with
a model trained in one loading into the other bit for bit."""
import torch

import holoflow as flow
from holoflow.utils import convert


def test_holoflow_checkpoint_to_torch_and_back(tmp_path):
    flow.manual_seed(0)
    fm = flow.nn.Sequential(flow.nn.Linear(3, 4), flow.nn.BatchNorm1d(4), flow.nn.Linear(4, 2))
    fm(flow.randn(8, 3))
    opt = flow.optim.Adam(fm.parameters(), lr=0.1)
    fm(flow.randn(8, 3)).sum().backward()
    opt.step()
    ck = {"model": fm.state_dict(), "optim": opt.state_dict(), "step": 3, "name": "run1"}
    hf, pt = tmp_path / "ck.hf", tmp_path / "ck.pt"
    flow.save(ck, hf)
    convert.convert_file(hf, pt, to="torch")
    tck = torch.load(pt, weights_only=True)
    assert tck["step"] == 3 and tck["name"] == "run1" and isinstance(tck["model"]["0.weight"], torch.Tensor)
    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    tm.load_state_dict(tck["model"])
    topt = torch.optim.Adam(tm.parameters(), lr=0.1)
    topt.load_state_dict(tck["optim"])
    x = torch.randn(5, 3)
    fm.eval()
    tm.eval()
    torch.testing.assert_close(fm(flow.from_torch(x)).to_torch(), tm(x), rtol=0, atol=0)
    back = tmp_path / "back.hf"
    convert.convert_file(pt, back, to="holoflow")
    again = flow.load(back)
    for k, v in fm.state_dict().items():
        assert torch.equal(again["model"][k].to_torch(), v.to_torch()), k
    assert again["optim"]["state"][0]["exp_avg"].shape == fm[0].weight.shape


def test_from_torch_file_reads_a_torch_state_dict(tmp_path):
    tm = torch.nn.Linear(3, 2)
    torch.save(tm.state_dict(), tmp_path / "w.pth")
    sd = convert.from_torch_file(tmp_path / "w.pth")
    fm = flow.nn.Linear(3, 2)
    fm.load_state_dict(sd)
    assert isinstance(sd["weight"], flow.Tensor)
    assert torch.equal(fm.weight.to_torch(), tm.weight.detach())


def test_bad_input_names_the_place():
    import pytest
    with pytest.raises(TypeError, match=r"obj\['m'\].*state_dict"):
        convert.to_torch({"m": object()})
    with pytest.raises(ValueError, match="to must be"):
        convert.convert_file("a", "b", to="onnx")
