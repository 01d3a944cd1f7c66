# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A keyword-spotting model trained as a speech team's script does: a 1-D conv net with
padding="same" convolutions whose BatchNorms are converted by SyncBatchNorm.convert_sync_batchnorm
(no process group: it runs as BatchNorm), TorchScript-compiled label smoothing (@torch.jit.script,
called outside autocast: TorchScript's own autocast pass runs mul in float32 under CPU autocast),
a GRU over padded variable-length clips (pad_sequence, pack_padded_sequence), bfloat16 autocast on
the CPU with torch.amp.GradScaler (scale, unscale_, clip_grad_norm_, step, update), Muon for the
2-D hidden weights and AdamW for the rest (two optimizers), the float32 matmul precision and TF32
switches a training script sets."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence

torch.set_float32_matmul_precision("high")
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True

N_WORDS = 5


@torch.jit.script
def smoothed_targets(words: torch.Tensor, n: int, eps: float) -> torch.Tensor:
    return F.one_hot(words, n).float() * (1.0 - eps) + eps / n


class ConvBlock(nn.Module):
    def __init__(self, c_in, c_out, k):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, k, padding="same", bias=False)
        self.bn = nn.BatchNorm1d(c_out)

    def forward(self, x):
        return F.gelu(self.bn(self.conv(x)), approximate="tanh")


class KWS(nn.Module):
    def __init__(self, n_mels=8, width=12, hidden=10):
        super().__init__()
        self.blocks = nn.Sequential(ConvBlock(n_mels, width, 5), ConvBlock(width, width, 3))
        self.gru = nn.GRU(width, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, N_WORDS)

    def forward(self, feats, lengths):
        h = self.blocks(feats.transpose(1, 2)).transpose(1, 2)          # (B, T, width)
        packed = pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
        _, last = self.gru(packed)
        return self.head(F.silu(self.proj(last[-1])))


torch.manual_seed(0)
model = nn.SyncBatchNorm.convert_sync_batchnorm(KWS())
assert isinstance(model.blocks[0].bn, nn.SyncBatchNorm)
hidden_2d = [p for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith("head")]
rest = [p for n, p in model.named_parameters() if p.ndim != 2 or n.startswith("head")]
muon = torch.optim.Muon(hidden_2d, lr=0.02, momentum=0.9)
adamw = torch.optim.AdamW(rest, lr=3e-3, weight_decay=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)

g = torch.Generator().manual_seed(3)
LOSSES = []
for step in range(5):
    lengths = torch.randint(6, 13, (6,), generator=g)
    words = torch.randint(0, N_WORDS, (6,), generator=g)
    clips = [torch.randn(int(n), 8, generator=g) + 0.5 * w for n, w in zip(lengths, words)]
    feats = pad_sequence(clips, batch_first=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(feats, lengths)
    loss = F.cross_entropy(logits.float(), smoothed_targets(words, N_WORDS, 0.1))
    muon.zero_grad()
    adamw.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(muon)
    scaler.unscale_(adamw)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=2.0)
    scaler.step(muon)
    scaler.step(adamw)
    scaler.update()
    LOSSES.append(loss.item())
LOSSES.append(scaler.get_scale() / 1024)

MODELS = {"kws": model}
