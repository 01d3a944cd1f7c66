# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A DDPM denoising step in the style of the "annotated diffusion" notebooks: a linear beta schedule
with torch.cumprod and F.pad of the shifted alphas, per-sample timestep coefficients gathered with
Tensor.gather and reshaped to (B, 1, 1, 1), sinusoidal time embeddings through an MLP, residual blocks
with GroupNorm + SiLU and a per-block time projection broadcast over H x W, a strided-conv downsample,
nearest-neighbour F.interpolate / nn.Upsample up, skip connections by torch.cat, a mid self-attention
block (scaled_dot_product_attention over flattened pixels), MSE on the predicted noise with a
Huber variant, AdamW with a linear warm-up (LambdaLR), an EMA copy updated with torch._foreach_lerp_-free
lerp_, and one ancestral sampling step p(x_{t-1} | x_t) under torch.no_grad."""
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def linear_beta_schedule(timesteps):
    return torch.linspace(1e-4, 0.02, timesteps)


T = 50
betas = linear_beta_schedule(T)
alphas = 1.0 - betas
alphas_cumprod = torch.cumprod(alphas, dim=0)
alphas_cumprod_prev = F.pad(alphas_cumprod[:-1], (1, 0), value=1.0)
sqrt_recip_alphas = torch.sqrt(1.0 / alphas)
sqrt_alphas_cumprod = torch.sqrt(alphas_cumprod)
sqrt_one_minus_alphas_cumprod = torch.sqrt(1.0 - alphas_cumprod)
posterior_variance = betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod)


def extract(a, t, x_shape):
    out = a.gather(-1, t.cpu())
    return out.reshape(t.shape[0], *((1,) * (len(x_shape) - 1))).to(t.device)


def q_sample(x_start, t, noise):
    return extract(sqrt_alphas_cumprod, t, x_start.shape) * x_start + \
        extract(sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise


class SinusoidalPositionEmbeddings(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, time):
        half_dim = self.dim // 2
        emb = math.log(10000) / (half_dim - 1)
        emb = torch.exp(torch.arange(half_dim, device=time.device) * -emb)
        emb = time[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class ResnetBlock(nn.Module):
    def __init__(self, dim, dim_out, time_emb_dim, groups=4):
        super().__init__()
        self.mlp = nn.Sequential(nn.SiLU(), nn.Linear(time_emb_dim, dim_out * 2))
        self.norm1 = nn.GroupNorm(groups, dim)
        self.conv1 = nn.Conv2d(dim, dim_out, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, dim_out)
        self.conv2 = nn.Conv2d(dim_out, dim_out, 3, padding=1)
        self.res_conv = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x, time_emb):
        scale, shift = self.mlp(time_emb)[:, :, None, None].chunk(2, dim=1)
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.norm2(h) * (scale + 1) + shift
        h = self.conv2(F.silu(h))
        return h + self.res_conv(x)


class Attention(nn.Module):
    def __init__(self, dim, heads=2):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(1, dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1, bias=False)
        self.to_out = nn.Conv2d(dim, dim, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.to_qkv(self.norm(x)).chunk(3, dim=1)
        q, k, v = (t.reshape(b, self.heads, c // self.heads, h * w).transpose(-1, -2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.transpose(-1, -2).reshape(b, c, h, w)
        return self.to_out(out) + x


class Unet(nn.Module):
    def __init__(self, dim=8, channels=1):
        super().__init__()
        time_dim = dim * 4
        self.time_mlp = nn.Sequential(SinusoidalPositionEmbeddings(dim), nn.Linear(dim, time_dim), nn.GELU(),
                                      nn.Linear(time_dim, time_dim))
        self.init_conv = nn.Conv2d(channels, dim, 7, padding=3)
        self.down1 = ResnetBlock(dim, dim, time_dim)
        self.downsample = nn.Conv2d(dim, 2 * dim, 4, stride=2, padding=1)
        self.down2 = ResnetBlock(2 * dim, 2 * dim, time_dim)
        self.mid_attn = Attention(2 * dim)
        self.mid = ResnetBlock(2 * dim, 2 * dim, time_dim)
        self.up2 = ResnetBlock(4 * dim, 2 * dim, time_dim)
        self.upsample = nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(2 * dim, dim, 3, padding=1))
        self.up1 = ResnetBlock(2 * dim, dim, time_dim)
        self.final = nn.Conv2d(dim, channels, 1)

    def forward(self, x, time):
        t = self.time_mlp(time)
        x = self.init_conv(x)
        h1 = self.down1(x, t)
        h2 = self.down2(self.downsample(h1), t)
        m = self.mid(self.mid_attn(h2), t)
        u = self.up2(torch.cat((m, h2), dim=1), t)
        u = self.upsample(u)
        u = F.interpolate(u, size=h1.shape[-2:], mode="nearest")
        u = self.up1(torch.cat((u, h1), dim=1), t)
        return self.final(u)


@torch.no_grad()
def p_sample(model, x, t, t_index):
    betas_t = extract(betas, t, x.shape)
    sqrt_one_minus_alphas_cumprod_t = extract(sqrt_one_minus_alphas_cumprod, t, x.shape)
    sqrt_recip_alphas_t = extract(sqrt_recip_alphas, t, x.shape)
    model_mean = sqrt_recip_alphas_t * (x - betas_t * model(x, t) / sqrt_one_minus_alphas_cumprod_t)
    if t_index == 0:
        return model_mean
    posterior_variance_t = extract(posterior_variance, t, x.shape)
    noise = torch.randn_like(x)
    return model_mean + torch.sqrt(posterior_variance_t) * noise


torch.manual_seed(3)
model = Unet()
ema = copy.deepcopy(model).requires_grad_(False)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-2)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
images = torch.rand(4, 1, 8, 8) * 2 - 1

LOSSES = []
for step in range(4):
    t = torch.randint(0, T, (images.shape[0],), dtype=torch.long)
    noise = torch.randn_like(images)
    x_noisy = q_sample(images, t, noise)
    predicted = model(x_noisy, t)
    loss = F.mse_loss(noise, predicted) + 0.1 * F.huber_loss(noise, predicted, delta=0.5)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.lerp_(pm, 0.1)
    LOSSES.append(loss.item())

x = torch.randn(2, 1, 8, 8)
for i in reversed(range(T - 3, T)):
    x = p_sample(ema, x, torch.full((2,), i, dtype=torch.long), i)
LOSSES.append(x.abs().mean().item())
LOSSES.append(x.clamp(-1, 1).std().item())
MODELS = {"unet": model}
