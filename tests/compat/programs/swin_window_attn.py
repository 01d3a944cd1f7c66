# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A two-stage Swin Transformer (microsoft/Swin-Transformer's swin_transformer.py, scaled down): Conv2d patch
embedding, an absolute position embedding resized to the patch grid as timm does (F.interpolate bicubic with
antialias), window attention with a relative position bias table indexed by a precomputed register_buffer
index (torch.meshgrid(indexing="ij"), torch.stack, permute, contiguous, sum), shifted windows by torch.roll with
the attention mask built from slices and masked_fill(-100.0), window partition/reverse by view/permute/contiguous,
timm's DropPath (x.new_empty(shape).bernoulli_(keep_prob).div_(keep_prob)) with a linearly increasing rate,
PatchMerging by torch.cat of strided slices, trunc_normal_ init via apply, AdaptiveAvgPool1d head. Training
uses mixup with F.one_hot soft targets and a soft-target cross entropy, AdamW with no weight decay for the
bias tables, norms and biases, and SequentialLR(LinearLR warm-up, CosineAnnealingLR)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def drop_path(x, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True):
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class DropPath(nn.Module):
    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(in_features, hidden_features), nn.GELU(), nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def window_partition(x, window_size):
    B, H, W, C = x.shape
    x = x.view(B, H // window_size, window_size, W // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C)


def window_reverse(windows, window_size, H, W):
    B = int(windows.shape[0] / (H * W / window_size / window_size))
    x = windows.view(B, H // window_size, W // window_size, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, window_size, num_heads, qkv_bias=True):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        coords_h, coords_w = torch.arange(self.window_size[0]), torch.arange(self.window_size[1])
        coords = torch.stack(torch.meshgrid([coords_h, coords_w], indexing="ij"))
        coords_flatten = torch.flatten(coords, 1)
        relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]
        relative_coords = relative_coords.permute(1, 2, 0).contiguous()
        relative_coords[:, :, 0] += self.window_size[0] - 1
        relative_coords[:, :, 1] += self.window_size[1] - 1
        relative_coords[:, :, 0] *= 2 * self.window_size[1] - 1
        relative_position_index = relative_coords.sum(-1)
        self.register_buffer("relative_position_index", relative_position_index)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        relative_position_bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(
            self.window_size[0] * self.window_size[1], self.window_size[0] * self.window_size[1], -1)
        relative_position_bias = relative_position_bias.permute(2, 0, 1).contiguous()
        attn = attn + relative_position_bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.softmax(attn)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj(x)


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, input_resolution, num_heads, window_size=2, shift_size=0, mlp_ratio=2.0, drop_path=0.0):
        super().__init__()
        self.dim, self.input_resolution, self.num_heads = dim, input_resolution, num_heads
        self.window_size, self.shift_size = window_size, shift_size
        if min(self.input_resolution) <= self.window_size:
            self.shift_size = 0
            self.window_size = min(self.input_resolution)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size=(self.window_size, self.window_size), num_heads=num_heads)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        if self.shift_size > 0:
            H, W = self.input_resolution
            img_mask = torch.zeros((1, H, W, 1))
            h_slices = (slice(0, -self.window_size), slice(-self.window_size, -self.shift_size),
                        slice(-self.shift_size, None))
            w_slices = (slice(0, -self.window_size), slice(-self.window_size, -self.shift_size),
                        slice(-self.shift_size, None))
            cnt = 0
            for h in h_slices:
                for w in w_slices:
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mask_windows = window_partition(img_mask, self.window_size).view(-1, self.window_size * self.window_size)
            attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
        else:
            attn_mask = None
        self.register_buffer("attn_mask", attn_mask)

    def forward(self, x):
        H, W = self.input_resolution
        B, L, C = x.shape
        assert L == H * W, "input feature has wrong size"
        shortcut = x
        x = self.norm1(x).view(B, H, W, C)
        if self.shift_size > 0:
            shifted_x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        else:
            shifted_x = x
        x_windows = window_partition(shifted_x, self.window_size).view(-1, self.window_size * self.window_size, C)
        attn_windows = self.attn(x_windows, mask=self.attn_mask).view(-1, self.window_size, self.window_size, C)
        shifted_x = window_reverse(attn_windows, self.window_size, H, W)
        if self.shift_size > 0:
            x = torch.roll(shifted_x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        else:
            x = shifted_x
        x = shortcut + self.drop_path(x.view(B, H * W, C))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    def __init__(self, input_resolution, dim):
        super().__init__()
        self.input_resolution, self.dim = input_resolution, dim
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x):
        H, W = self.input_resolution
        B, L, C = x.shape
        x = x.view(B, H, W, C)
        x0, x1 = x[:, 0::2, 0::2, :], x[:, 1::2, 0::2, :]
        x2, x3 = x[:, 0::2, 1::2, :], x[:, 1::2, 1::2, :]
        x = torch.cat([x0, x1, x2, x3], -1).view(B, -1, 4 * C)
        return self.reduction(self.norm(x))


class SwinTransformer(nn.Module):
    def __init__(self, img_size=16, patch_size=2, in_chans=3, num_classes=5, embed_dim=8, depths=(2, 2),
                 num_heads=(2, 4), window_size=4, drop_path_rate=0.2, pos_grid=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)
        self.patch_norm = nn.LayerNorm(embed_dim)
        res = img_size // patch_size
        self.absolute_pos_embed = nn.Parameter(torch.zeros(1, pos_grid * pos_grid, embed_dim))
        nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        self.pos_grid = pos_grid
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, sum(depths))]
        self.layers = nn.ModuleList()
        dim = embed_dim
        for i, depth in enumerate(depths):
            blocks = [SwinTransformerBlock(dim, (res, res), num_heads[i], window_size,
                                           0 if j % 2 == 0 else window_size // 2, drop_path=dpr[sum(depths[:i]) + j])
                      for j in range(depth)]
            if i < len(depths) - 1:
                blocks.append(PatchMerging((res, res), dim))
                dim, res = dim * 2, res // 2
            self.layers.append(nn.Sequential(*blocks))
        self.norm = nn.LayerNorm(dim)
        self.avgpool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(dim, num_classes)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def forward(self, x):
        x = self.patch_embed(x)
        B, C, H, W = x.shape
        x = self.patch_norm(x.flatten(2).transpose(1, 2))
        pos = self.absolute_pos_embed.reshape(1, self.pos_grid, self.pos_grid, C).permute(0, 3, 1, 2)
        pos = F.interpolate(pos, size=(H, W), mode="bicubic", align_corners=False, antialias=True)
        x = x + pos.permute(0, 2, 3, 1).flatten(1, 2)
        for layer in self.layers:
            x = layer(x)
        x = self.avgpool(self.norm(x).transpose(1, 2))
        return self.head(torch.flatten(x, 1))


def param_groups(model, weight_decay, skip_keywords=("relative_position_bias_table", "absolute_pos_embed")):
    has_decay, no_decay = [], []
    for name, param in model.named_parameters():
        if len(param.shape) == 1 or name.endswith(".bias") or any(k in name for k in skip_keywords):
            no_decay.append(param)
        else:
            has_decay.append(param)
    return [{"params": has_decay}, {"params": no_decay, "weight_decay": 0.0}]


torch.manual_seed(3)
model = SwinTransformer()
optimizer = torch.optim.AdamW(param_groups(model, 0.05), lr=2e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999))
warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=2)
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=3, eta_min=1e-5)
scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[2])
images, labels = torch.randn(6, 3, 16, 16), torch.tensor([0, 1, 2, 3, 4, 0])
num_classes, lam = 5, 0.7
LOSSES = []
model.train()
for step in range(5):
    targets = F.one_hot(labels, num_classes).float()
    mixed = lam * images + (1 - lam) * images.flip(0)
    soft = lam * targets + (1 - lam) * targets.flip(0)
    logits = model(mixed)
    loss = torch.sum(-soft * F.log_softmax(logits, dim=-1), dim=-1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    LOSSES += [loss.item(), scheduler.get_last_lr()[0]]
model.eval()
with torch.no_grad():
    out = model(images)
    LOSSES += [F.cross_entropy(out, labels).item(), (out.argmax(1) == labels).float().mean().item()]
model.train()
optimizer.zero_grad()
F.cross_entropy(model(images), labels, label_smoothing=0.1).backward()
MODELS = {"swin": model}
