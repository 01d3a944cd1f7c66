"""Unmodified PyTorch training scripts (``import torch`` ...) run on holoflow through mock_torch.

Each script is source text written purely against PyTorch's API. It is exec'd twice in fresh
namespaces: once with the real torch, once inside ``holoflow.mock_torch.enable()``, where the very
same ``import torch`` statements resolve to holoflow. Both runs seed with ``torch.manual_seed`` and
build the model in the same order; holoflow draws from torch's RNG, so the initial weights are
identical (checked), and the per-step losses over 12 training steps must agree within 2e-3.
"""
from __future__ import annotations

import importlib
import linecache

import numpy as np
import pytest
import torch as real_torch

import holoflow as flow
from holoflow import mock_torch

STEPS = 12
RTOL = 2e-3

GPT_SCRIPT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
import numpy as np

VOCAB, BLOCK, N_EMBD, N_HEAD, BATCH, STEPS = 40, 16, 32, 4, 4, 12


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, N_EMBD)
        self.pos = nn.Embedding(BLOCK, N_EMBD)
        self.blocks = nn.Sequential(Block(N_EMBD, N_HEAD), Block(N_EMBD, N_HEAD))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.head = nn.Linear(N_EMBD, VOCAB, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


torch.manual_seed(1234)
model = GPT()
init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

rng = np.random.default_rng(0)
starts = rng.integers(0, VOCAB, size=(STEPS, BATCH, 1))     # random sequences with a learnable rule:
steps = rng.integers(1, 3, size=(STEPS, BATCH, 1))          # arithmetic progressions mod VOCAB
data = torch.from_numpy(((starts + steps * np.arange(BLOCK + 1)) % VOCAB).astype(np.int64))

opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
warmup = 4
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))

losses, lrs = [], []
model.train()
for step in range(STEPS):
    x, y = data[step, :, :-1], data[step, :, 1:]
    loss = model(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    losses.append(loss.item())
    lrs.append(opt.param_groups[0]["lr"])
'''

CNN_SCRIPT = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import numpy as np


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, width=8, n_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, n_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


torch.manual_seed(4321)
model = ResNet()
init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

rng = np.random.default_rng(1)
templates = rng.standard_normal((10, 3, 12, 12))           # noisy class templates: learnable
classes = rng.integers(0, 10, size=12 * 16)
noise = rng.standard_normal((12 * 16, 3, 12, 12))
images = torch.from_numpy((templates[classes] + noise).astype(np.float32))
labels = torch.from_numpy(classes.astype(np.int64))
loader = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=False)

opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
losses = []
model.train()
for x, y in loader:
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())

model.eval()
with torch.no_grad():
    eval_logits = model(images[:16])
final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
'''


def _exec(script: str) -> dict:
    """Runs ``script`` as a user module would: a fresh namespace, a name outside holoflow/torch."""
    name = f"<pytorch script {abs(hash(script)):x}>"
    linecache.cache[name] = (len(script), None, script.splitlines(True), name)  # readable tracebacks
    g = {"__name__": "user_training_script"}
    exec(compile(script, name, "exec"), g)
    return g


def _np(t) -> np.ndarray:
    if isinstance(t, flow.Tensor):
        t = t.to_torch()
    assert isinstance(t, real_torch.Tensor), type(t)
    return t.detach().cpu().numpy()


def _run_both(script: str) -> tuple[dict, dict]:
    assert not mock_torch.is_enabled()
    tg = _exec(script)
    assert tg["torch"] is real_torch
    with mock_torch.enable():
        fg = _exec(script)
    assert not mock_torch.is_enabled()
    assert fg["torch"] is not real_torch and fg["torch"].Tensor is flow.Tensor
    assert fg["F"] is not real_torch.nn.functional and fg["F"].cross_entropy is flow.nn.functional.cross_entropy
    assert isinstance(fg["model"], flow.nn.Module) and isinstance(fg["opt"], flow.optim.Optimizer)
    assert isinstance(fg["losses"][0], float)
    # after the context manager, `import torch` is the real torch again
    g = _exec("import torch\nimport torch.nn.functional as F")
    assert g["torch"] is real_torch and g["F"] is real_torch.nn.functional
    assert importlib.import_module("torch") is real_torch
    return tg, fg


def _assert_same_state(ts: dict, fs: dict, **tol) -> None:
    assert list(ts) == list(fs)
    for k in ts:
        a, b = _np(ts[k]), _np(fs[k])
        assert a.shape == b.shape and a.dtype == b.dtype, k
        np.testing.assert_allclose(b, a, err_msg=k, **tol)


def _assert_losses_match(tl: list, fl: list) -> None:
    assert len(tl) == len(fl) == STEPS
    rel = np.abs(np.asarray(fl) - np.asarray(tl)) / np.abs(np.asarray(tl))
    print(f"max relative loss difference {rel.max():.2e}; torch {tl[0]:.4f} -> {tl[-1]:.4f}")
    assert rel.max() < RTOL, (rel.max(), tl, fl)


@pytest.fixture(autouse=True)
def _mock_off():
    yield
    mock_torch.disable()


def test_gpt_script_trains_identically_under_mock_torch():
    tg, fg = _run_both(GPT_SCRIPT)
    _assert_same_state(tg["init_state"], fg["init_state"], rtol=0, atol=0)   # same RNG, same init
    assert isinstance(fg["sched"], flow.optim.lr_scheduler.LambdaLR)
    np.testing.assert_allclose(fg["lrs"], tg["lrs"], rtol=1e-12)
    _assert_losses_match(tg["losses"], fg["losses"])
    assert tg["losses"][-1] < tg["losses"][0]


def test_resnet_script_trains_identically_under_mock_torch():
    tg, fg = _run_both(CNN_SCRIPT)
    _assert_same_state(tg["init_state"], fg["init_state"], rtol=0, atol=0)
    assert isinstance(fg["loader"], flow.utils.data.DataLoader)
    _assert_losses_match(tg["losses"], fg["losses"])
    assert np.mean(tg["losses"][-3:]) < np.mean(tg["losses"][:3])
    # BatchNorm running statistics and num_batches_tracked follow torch's too
    _assert_same_state(tg["final_state"], fg["final_state"], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(_np(fg["eval_logits"]), _np(tg["eval_logits"]), rtol=1e-3, atol=1e-4)


def test_disable_gives_real_torch_back():
    mock_torch.enable()
    assert _exec("import torch")["torch"] is not real_torch
    mock_torch.disable()
    g = _exec("import torch\nimport torch.nn as nn")
    assert g["torch"] is real_torch and g["nn"] is real_torch.nn
