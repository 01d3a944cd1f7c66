# ruff: noqa: B007  (published-style loops keep their unused counters)
"""The boilerplate around a training loop that most scripts carry: device selection with a CUDA
fallback, cudnn/deterministic switches, nn.DataParallel wrapping (a no-op on the CPU; the module
reached through .module), torch.profiler.profile with record_function around steps,
torch.autograd.set_detect_anomaly toggles, numpy interop (from_numpy, .numpy(), np.asarray,
tolist), set_printoptions and a repr of a tensor, a tensor's apply_ of a Python function, a
ReduceLROnPlateau schedule on a validation loss, early stopping state in a dict, and a
checkpoint dict of model, optimizer, scheduler and RNG states saved and restored mid-run."""
import io

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.backends.cudnn.benchmark = True
torch.use_deterministic_algorithms(True, warn_only=True)
torch.set_printoptions(precision=3, sci_mode=False)

torch.manual_seed(0)
np_rng = np.random.default_rng(0)
net = nn.Sequential(nn.Linear(4, 16), nn.Mish(), nn.Dropout(0.1), nn.Linear(16, 1))
model = nn.DataParallel(net).to(device)
assert model.module is net
opt = torch.optim.RAdam(model.parameters(), lr=1e-2, decoupled_weight_decay=True, weight_decay=1e-3)
sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0)

x_all = torch.from_numpy(np_rng.standard_normal((40, 4)).astype(np.float32)).to(device)
y_all = (x_all[:, :1] * 2 - x_all[:, 1:2] + 0.1 * torch.from_numpy(np_rng.standard_normal((40, 1)).astype(np.float32)))
x_val, y_val = x_all[32:], y_all[32:]
label_noise = torch.zeros(32)
label_noise.apply_(lambda v: v + 0.01)                # a Python function per element (CPU tensors)

LOSSES, early = [], {"best": float("inf"), "bad": 0}
saved = None
with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
    for epoch in range(4):
        model.train()
        torch.autograd.set_detect_anomaly(epoch == 1)
        for i in range(0, 32, 8):
            with record_function("train_step"):
                pred = model(x_all[i:i + 8])
                loss = F.smooth_l1_loss(pred, y_all[i:i + 8] + label_noise[i:i + 8, None], beta=0.5)
                opt.zero_grad()
                loss.backward()
                opt.step()
        torch.autograd.set_detect_anomaly(False)
        model.eval()
        with torch.no_grad():
            val = F.mse_loss(model(x_val), y_val).item()
        sched.step(val)
        if val < early["best"]:
            early.update(best=val, bad=0)
        else:
            early["bad"] += 1
        LOSSES += [loss.item(), val, opt.param_groups[0]["lr"]]
        if epoch == 1:                                  # checkpoint mid-run
            saved = io.BytesIO()
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "rng": torch.get_rng_state(), "epoch": epoch}, saved)

saved.seek(0)
state = torch.load(saved, weights_only=False)
model.module.load_state_dict(state["model"])
opt.load_state_dict(state["opt"])
sched.load_state_dict(state["sched"])
torch.set_rng_state(state["rng"])
LOSSES.append(float(torch.rand(())))                  # the restored stream
text = repr(torch.tensor([1 / 3, 2e-5]))
LOSSES.append(float(len(text)))
arr = np.asarray(model.module[0].weight.detach())
LOSSES.append(float(arr.sum()) + sum(model.module[3].bias.detach().numpy().tolist()))
assert any(e.key == "train_step" for e in prof.key_averages())
torch.set_printoptions(profile="default")
torch.use_deterministic_algorithms(False)

model.train()
F.mse_loss(model(x_all[:8]), y_all[:8]).backward()
MODELS = {"net": net}
