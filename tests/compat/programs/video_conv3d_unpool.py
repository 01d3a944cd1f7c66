# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A small video action classifier with a reconstruction side task, in the style of a research
codebase: Conv3d + BatchNorm3d + LocalResponseNorm (AlexNet-style), MaxPool3d with
return_indices feeding a MaxUnpool3d decoder, tubelet tokens cut by nn.Unfold and put back by
nn.Fold, a LazyLinear head (materialized by a dry run before the optimizer is built), an
nn.ParameterDict of per-class logit temperatures, AlphaDropout, HuberLoss on the reconstruction
and a hand-made label-smoothed loss from F.one_hot and torch.special.xlogy / logsumexp; clips come
from an IterableDataset through a DataLoader; AdamW with a ChainedScheduler (LinearLR warm-up with
ExponentialLR); evaluation under torch.set_grad_enabled(False) with torch.histc / torch.unique
metrics, masked_scatter of the predictions and the logits' sensitivity to a brightness change
by forward-mode AD (torch.autograd.forward_ad dual tensors)."""
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset

NUM_CLASSES = 4


class Clips(IterableDataset):
    """Synthetic clips (C=2, T=4, H=W=8) whose class shifts a moving blob."""

    def __init__(self, n, seed):
        self.n, self.seed = n, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        for i in range(self.n):
            y = int(torch.randint(0, NUM_CLASSES, (1,), generator=g))
            clip = 0.3 * torch.randn(2, 4, 8, 8, generator=g)
            for t in range(4):
                r, c = (y + t) % 6, (2 * y + t) % 6
                clip[:, t, r:r + 2, c:c + 2] += 1.0
            yield clip, y


class VideoNet(nn.Module):
    def __init__(self, width=6):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv3d(2, width, kernel_size=3, padding=1, bias=False),
                                  nn.BatchNorm3d(width), nn.ReLU(inplace=True),
                                  nn.LocalResponseNorm(size=3, alpha=1e-3, beta=0.75, k=2.0))
        self.pool = nn.MaxPool3d(kernel_size=(1, 2, 2), return_indices=True)
        self.unpool = nn.MaxUnpool3d(kernel_size=(1, 2, 2))
        self.decode = nn.Conv3d(width, 2, kernel_size=1)
        # tubelet tokens over the pooled frames: 2x2 patches of the (T*width, 4, 4) map
        self.unfold = nn.Unfold(kernel_size=2, stride=2)
        self.fold = nn.Fold(output_size=(4, 4), kernel_size=2, stride=2)
        self.mix = nn.Linear(4 * width * 4, 4 * width * 4)
        self.drop = nn.AlphaDropout(p=0.1)
        self.head = nn.LazyLinear(NUM_CLASSES)
        self.temperature = nn.ParameterDict({f"c{k}": nn.Parameter(torch.ones(())) for k in range(NUM_CLASSES)})

    def forward(self, x):
        h = self.stem(x)                                   # (B, W, T, 8, 8)
        p, idx = self.pool(h)                              # (B, W, T, 4, 4)
        recon = self.decode(self.unpool(p, idx, output_size=h.shape[2:]))
        b, w, t = p.shape[:3]
        frames = p.reshape(b, w * t, 4, 4)
        tokens = self.unfold(frames)                       # (B, W*T*4, 4 patches)
        tokens = tokens + self.mix(tokens.transpose(1, 2)).transpose(1, 2).tanh()
        frames = self.fold(tokens) + frames               # back to (B, W*T, 4, 4), residual
        feat = F.selu(frames.flatten(1))
        logits = self.head(self.drop(feat))
        temps = torch.stack([self.temperature[f"c{k}"] for k in range(NUM_CLASSES)])
        return logits / temps.clamp(min=0.1), recon


def smoothed_nll(logits, target, eps=0.1):
    q = F.one_hot(target, NUM_CLASSES).float() * (1 - eps) + eps / NUM_CLASSES
    logp = logits - torch.special.logsumexp(logits, dim=1, keepdim=True)
    # cross entropy plus the targets' entropy: KL(q || p), xlogy keeps q log q finite at q = 0
    return (torch.special.xlogy(q, q) - q * logp).sum(1).mean()


torch.manual_seed(0)
model = VideoNet()
loader = DataLoader(Clips(24, seed=1), batch_size=8)
with torch.no_grad():                                      # materialize the LazyLinear
    model(torch.zeros(2, 2, 4, 8, 8))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
sched = torch.optim.lr_scheduler.ChainedScheduler([
    torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.3, total_iters=3),
    torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.95)])
huber = nn.HuberLoss(delta=0.5)

LOSSES = []
for epoch in range(2):
    model.train()
    for clip, y in loader:
        logits, recon = model(clip)
        loss = smoothed_nll(logits, y) + 0.5 * huber(recon, clip)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        LOSSES.append(loss.item())

    model.eval()
    with torch.set_grad_enabled(False):
        clips, labels = next(iter(DataLoader(Clips(16, seed=7), batch_size=16)))
        logits, _ = model(clips)
        pred = logits.argmax(1)
        hist = torch.histc(pred.float(), bins=NUM_CLASSES, min=0, max=NUM_CLASSES - 1)
        seen = torch.unique(labels, sorted=True)
        marked = torch.full_like(labels, -1).masked_scatter(pred == labels, pred[pred == labels])
        # input sensitivity: the logits' directional derivative along a brightness change (forward AD)
        with fwAD.dual_level():
            dual = fwAD.make_dual(clips, torch.ones_like(clips) / clips[0].numel() ** 0.5)
            sensitivity = fwAD.unpack_dual(model(dual)[0]).tangent.abs().mean()
        LOSSES.append(float(hist.max()) / 16 + 0.01 * len(seen) + 0.001 * float((marked >= 0).sum()))
        LOSSES.append(float(sensitivity))
    assert torch.is_grad_enabled()

MODELS = {"video": model}
