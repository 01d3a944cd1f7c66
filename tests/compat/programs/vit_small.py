# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A small Vision Transformer: conv patch embedding, class token and learned positions,
pre-norm nn.TransformerEncoder (batch_first, GELU), AdamW, label smoothing, warmup via LambdaLR."""
import math

import torch
import torch.nn as nn


class ViT(nn.Module):
    def __init__(self, image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=64):
        super().__init__()
        num_patches = (image_size // patch_size) ** 2
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, mlp_dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, img):
        x = self.patch_embed(img).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embedding
        x = self.encoder(x)
        return self.head(self.norm(x[:, 0]))


torch.manual_seed(0)
model = ViT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
warmup, total = 2, 4
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / total)))
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
images, labels = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
LOSSES = []
for step in range(3):
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    LOSSES.append(loss.item())
MODELS = {"vit": model}
