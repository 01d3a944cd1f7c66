# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A masked autoencoder (MAE) pre-training step as the reference code writes it: patches by
unfold-style reshapes, per-sample random masking by argsort of noise (torch.gather of the kept
patches, the restore order by a second argsort), a learned mask token expanded into the masked
slots, trunc_normal_ initialisation, pre-norm ViT blocks with nn.MultiheadAttention
(need_weights=False) run through torch.utils.checkpoint (use_reentrant=False) under bfloat16
autocast, a forward hook collecting the encoder's features, the loss on the masked patches only
(normalised pixel targets), AdamW with no weight decay on norms, biases and tokens, and
CosineAnnealingWarmRestarts."""
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

IMG, PATCH, DIM = 8, 2, 16
N_PATCH = (IMG // PATCH) ** 2


def patchify(imgs):
    b, c, h, w = imgs.shape
    x = imgs.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(b, N_PATCH, PATCH * PATCH * c)


class Block(nn.Module):
    def __init__(self, dim, heads=2):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class MAE(nn.Module):
    def __init__(self, mask_ratio=0.5):
        super().__init__()
        self.mask_ratio = mask_ratio
        self.embed = nn.Linear(PATCH * PATCH * 3, DIM)
        self.pos = nn.Parameter(torch.zeros(1, N_PATCH, DIM))
        self.encoder = nn.ModuleList([Block(DIM), Block(DIM)])
        self.enc_norm = nn.LayerNorm(DIM)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, DIM))
        self.decoder = Block(DIM)
        self.pred = nn.Linear(DIM, PATCH * PATCH * 3)
        nn.init.trunc_normal_(self.pos, std=0.02)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def random_masking(self, x, generator):
        b, n, d = x.shape
        keep = int(n * (1 - self.mask_ratio))
        noise = torch.rand(b, n, generator=generator)
        shuffle = torch.argsort(noise, dim=1)
        restore = torch.argsort(shuffle, dim=1)
        kept = torch.gather(x, 1, shuffle[:, :keep, None].expand(-1, -1, d))
        mask = torch.ones(b, n)
        mask[:, :keep] = 0
        return kept, torch.gather(mask, 1, restore), restore

    def forward(self, imgs, generator):
        x = self.embed(patchify(imgs)) + self.pos
        x, mask, restore = self.random_masking(x, generator)
        for blk in self.encoder:
            x = checkpoint(blk, x, use_reentrant=False)
        x = self.enc_norm(x)
        b, keep, d = x.shape
        tokens = torch.cat([x, self.mask_token.expand(b, N_PATCH - keep, d)], dim=1)
        tokens = torch.gather(tokens, 1, restore[:, :, None].expand(-1, -1, d)) + self.pos
        return self.pred(self.decoder(tokens)), mask


def mae_loss(imgs, pred, mask):
    target = patchify(imgs)
    mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
    target = (target - mean) / (var + 1e-6) ** 0.5
    per_patch = ((pred.float() - target) ** 2).mean(-1)
    return (per_patch * mask).sum() / mask.sum()


torch.manual_seed(0)
model = MAE()
features = []
model.enc_norm.register_forward_hook(lambda mod, inp, out: features.append(out.detach().float().std()))
decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos" not in n and "token" not in n]
no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "pos" not in n and "token" not in n)]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=2e-3, betas=(0.9, 0.95))
sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2, T_mult=2)

data = torch.Generator().manual_seed(1)
masks = torch.Generator().manual_seed(2)
LOSSES = []
for step in range(4):
    imgs = torch.randn(3, 3, IMG, IMG, generator=data)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred, mask = model(imgs, masks)
    loss = mae_loss(imgs, pred, mask)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step(step + 0.5)
    LOSSES.append(loss.item())
LOSSES.append(float(torch.stack(features).mean()))

MODELS = {"mae": model}
