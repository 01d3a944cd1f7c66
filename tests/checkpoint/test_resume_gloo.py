"""Train on 2 Gloo ranks, save, resume on 4 ranks in other layouts and on 1 process: the
continued losses equal an uninterrupted run (and torch's, as the oracle)."""
import torch

import holoflow as flow

import ckpt_fns

N, M = 3, 3


def _data():
    return ckpt_fns.data(N + M)


def _torch_losses(data):
    m = ckpt_fns.model("single")
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref.load_state_dict({k: v.to_torch() for k, v in m.state_dict().items()})
    opt = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.01)
    out = []
    for x, y in zip(*data):
        loss = ((ref(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_save_on_2_ranks_resume_on_4_ranks_other_layouts_and_on_1_process(world2, world4, tmp_path):
    data = _data()
    whole = ckpt_fns.train(0, "single", data, 0, N + M)
    torch.testing.assert_close(torch.tensor(whole), torch.tensor(_torch_losses(data)), rtol=1e-5, atol=1e-6)
    ck = str(tmp_path / "ck")
    first = world2.run(ckpt_fns.train, "dp2", data, 0, N, None, ck)
    for losses in first:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(whole[:N]), rtol=1e-5, atol=1e-6)
    for mode in ("tp4", "2d4"):
        for r, losses in enumerate(world4.run(ckpt_fns.train, mode, data, N, N + M, ck)):
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(whole[N:]), rtol=1e-5, atol=1e-6,
                                       msg=lambda m, mode=mode, r=r: f"{mode} rank {r}: {m}")
    one = ckpt_fns.train(0, "single", data, N, N + M, ck)      # this process: a world of one
    torch.testing.assert_close(torch.tensor(one), torch.tensor(whole[N:]), rtol=1e-5, atol=1e-6)
    assert isinstance(flow.load(ck)["model"]["0.weight"], flow.Tensor)
