# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A tiny NeRF (Mildenhall et al.) step in the style of nerf-pytorch: rays from a pinhole camera
(torch.meshgrid indexing="xy", a camera-to-world matrix, broadcasting), stratified sampling along rays
(torch.linspace + torch.rand jitter between midpoints), a sinusoidal positional encoding with
log-sampled frequencies, an MLP with a skip connection (torch.cat) and a view-direction branch,
volume rendering (alpha = 1 - exp(-relu(sigma) * delta), transmittance by an exclusive
torch.cumprod with a prepended ones column, weights, rgb/depth/accumulated opacity maps, a white
background), hierarchical sampling of a fine pass from the coarse weights (an inverse-CDF with
torch.searchsorted(right=True), gather and torch.sort of the merged samples) under detach, MSE loss
and PSNR with torch.log10, Adam with an exponential lr decay written by hand."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Embedder:
    def __init__(self, multires):
        self.freq_bands = 2.0 ** torch.linspace(0.0, multires - 1, steps=multires)
        self.out_dim = 3 + 3 * 2 * multires

    def __call__(self, x):
        parts = [x]
        for freq in self.freq_bands:
            parts += [torch.sin(x * freq), torch.cos(x * freq)]
        return torch.cat(parts, dim=-1)


class NeRF(nn.Module):
    def __init__(self, D=4, W=32, input_ch=27, input_ch_views=15, skips=(2,)):
        super().__init__()
        self.skips = skips
        self.pts_linears = nn.ModuleList([nn.Linear(input_ch, W)] + [
            nn.Linear(W + input_ch if i in skips else W, W) for i in range(1, D)])
        self.views_linears = nn.ModuleList([nn.Linear(input_ch_views + W, W // 2)])
        self.feature_linear = nn.Linear(W, W)
        self.alpha_linear = nn.Linear(W, 1)
        self.rgb_linear = nn.Linear(W // 2, 3)

    def forward(self, input_pts, input_views):
        h = input_pts
        for i, layer in enumerate(self.pts_linears):
            if i in self.skips:
                h = torch.cat([input_pts, h], -1)
            h = F.relu(layer(h))
        alpha = self.alpha_linear(h)
        h = torch.cat([self.feature_linear(h), input_views], -1)
        for layer in self.views_linears:
            h = F.relu(layer(h))
        return torch.cat([self.rgb_linear(h), alpha], -1)


def get_rays(H, W, focal, c2w):
    i, j = torch.meshgrid(torch.linspace(0, W - 1, W), torch.linspace(0, H - 1, H), indexing="xy")
    dirs = torch.stack([(i - W * 0.5) / focal, -(j - H * 0.5) / focal, -torch.ones_like(i)], -1)
    rays_d = torch.sum(dirs[..., None, :] * c2w[:3, :3], -1)
    rays_o = c2w[:3, -1].expand(rays_d.shape)
    return rays_o, rays_d


def raw2outputs(raw, z_vals, rays_d, white_bkgd=True):
    dists = z_vals[..., 1:] - z_vals[..., :-1]
    dists = torch.cat([dists, torch.tensor([1e10]).expand(dists[..., :1].shape)], -1)
    dists = dists * torch.norm(rays_d[..., None, :], dim=-1)
    rgb = torch.sigmoid(raw[..., :3])
    alpha = 1.0 - torch.exp(-F.relu(raw[..., 3]) * dists)
    transmittance = torch.cumprod(torch.cat([torch.ones((alpha.shape[0], 1)), 1.0 - alpha + 1e-10], -1), -1)[:, :-1]
    weights = alpha * transmittance
    rgb_map = torch.sum(weights[..., None] * rgb, -2)
    depth_map = torch.sum(weights * z_vals, -1)
    acc_map = torch.sum(weights, -1)
    disp_map = 1.0 / torch.max(1e-10 * torch.ones_like(depth_map), depth_map / acc_map.clamp(min=1e-10))
    if white_bkgd:
        rgb_map = rgb_map + (1.0 - acc_map[..., None])
    return rgb_map, disp_map, acc_map, weights, depth_map


def sample_pdf(bins, weights, N_samples):
    weights = weights + 1e-5
    pdf = weights / torch.sum(weights, -1, keepdim=True)
    cdf = torch.cumsum(pdf, -1)
    cdf = torch.cat([torch.zeros_like(cdf[..., :1]), cdf], -1)
    u = torch.rand(list(cdf.shape[:-1]) + [N_samples]).contiguous()
    inds = torch.searchsorted(cdf, u, right=True)
    below = torch.max(torch.zeros_like(inds - 1), inds - 1)
    above = torch.min((cdf.shape[-1] - 1) * torch.ones_like(inds), inds)
    inds_g = torch.stack([below, above], -1)
    matched_shape = [inds_g.shape[0], inds_g.shape[1], cdf.shape[-1]]
    cdf_g = torch.gather(cdf.unsqueeze(1).expand(matched_shape), 2, inds_g)
    bins_g = torch.gather(bins.unsqueeze(1).expand(matched_shape), 2, inds_g)
    denom = cdf_g[..., 1] - cdf_g[..., 0]
    denom = torch.where(denom < 1e-5, torch.ones_like(denom), denom)
    t = (u - cdf_g[..., 0]) / denom
    return bins_g[..., 0] + t * (bins_g[..., 1] - bins_g[..., 0])


def render_rays(model, fine, embed, embed_dirs, rays_o, rays_d, near=2.0, far=6.0, N_samples=12, N_importance=8):
    N_rays = rays_o.shape[0]
    t_vals = torch.linspace(0.0, 1.0, steps=N_samples)
    z_vals = (near * (1.0 - t_vals) + far * t_vals).expand([N_rays, N_samples])
    mids = 0.5 * (z_vals[..., 1:] + z_vals[..., :-1])
    upper = torch.cat([mids, z_vals[..., -1:]], -1)
    lower = torch.cat([z_vals[..., :1], mids], -1)
    z_vals = lower + (upper - lower) * torch.rand(z_vals.shape)
    viewdirs = rays_d / torch.norm(rays_d, dim=-1, keepdim=True)

    def run(net, z):
        pts = rays_o[..., None, :] + rays_d[..., None, :] * z[..., :, None]
        dirs = viewdirs[:, None].expand(pts.shape)
        raw = net(embed(pts.reshape(-1, 3)), embed_dirs(dirs.reshape(-1, 3))).reshape(*pts.shape[:2], 4)
        return raw2outputs(raw, z, rays_d)

    rgb0, disp0, acc0, weights, _ = run(model, z_vals)
    z_vals_mid = 0.5 * (z_vals[..., 1:] + z_vals[..., :-1])
    z_samples = sample_pdf(z_vals_mid, weights[..., 1:-1], N_importance).detach()
    z_all, _ = torch.sort(torch.cat([z_vals, z_samples], -1), -1)
    rgb, disp, acc, _, depth = run(fine, z_all)
    return rgb, rgb0, disp, acc, depth


torch.manual_seed(6)
embed, embed_dirs = Embedder(4), Embedder(2)
model = NeRF(input_ch=embed.out_dim, input_ch_views=embed_dirs.out_dim)
model_fine = NeRF(input_ch=embed.out_dim, input_ch_views=embed_dirs.out_dim)
params = list(model.parameters()) + list(model_fine.parameters())
lrate, lrate_decay = 5e-3, 50
optimizer = torch.optim.Adam(params=params, lr=lrate, betas=(0.9, 0.999))
theta = 0.3
c2w = torch.tensor([[math.cos(theta), 0.0, math.sin(theta), 4.0 * math.sin(theta)],
                    [0.0, 1.0, 0.0, 0.0],
                    [-math.sin(theta), 0.0, math.cos(theta), 4.0 * math.cos(theta)]])
H, W, focal = 6, 5, 6.0
rays_o, rays_d = get_rays(H, W, focal, c2w)
target = torch.rand(H, W, 3)
img2mse = lambda x, y: torch.mean((x - y) ** 2)  # noqa: E731
mse2psnr = lambda x: -10.0 * torch.log(x) / torch.log(torch.tensor([10.0]))  # noqa: E731

LOSSES = []
for global_step in range(4):
    select = torch.randperm(H * W)[:16]
    batch_o, batch_d = rays_o.reshape(-1, 3)[select], rays_d.reshape(-1, 3)[select]
    target_s = target.reshape(-1, 3)[select]
    rgb, rgb0, disp, acc, depth = render_rays(model, model_fine, embed, embed_dirs, batch_o, batch_d)
    img_loss = img2mse(rgb, target_s)
    loss = img_loss + img2mse(rgb0, target_s)
    psnr = mse2psnr(img_loss)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    new_lrate = lrate * (0.1 ** (global_step / lrate_decay))
    for param_group in optimizer.param_groups:
        param_group["lr"] = new_lrate
    LOSSES.extend([loss.item(), psnr.item(), disp.mean().item(), acc.mean().item(), depth.mean().item()])
MODELS = {"coarse": model, "fine": model_fine}
