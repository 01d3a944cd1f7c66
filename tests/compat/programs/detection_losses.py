# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A one-stage detector's head and losses, as torchvision-style code writes them: anchors from
meshgrid, pairwise box IoU with clamp, matching by max/argmax with a threshold, boolean-mask
selection, focal loss from binary_cross_entropy_with_logits, GIoU regression loss, topk + sort
for the kept boxes, index_put_ with accumulate for a per-class count, and SGD with nesterov."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def box_iou(a, b):
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def giou_loss(p, t):
    x1, y1 = torch.max(p[:, 0], t[:, 0]), torch.max(p[:, 1], t[:, 1])
    x2, y2 = torch.min(p[:, 2], t[:, 2]), torch.min(p[:, 3], t[:, 3])
    inter = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    ap = (p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1])
    at = (t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1])
    union = ap + at - inter
    cx1, cy1 = torch.min(p[:, 0], t[:, 0]), torch.min(p[:, 1], t[:, 1])
    cx2, cy2 = torch.max(p[:, 2], t[:, 2]), torch.max(p[:, 3], t[:, 3])
    hull = (cx2 - cx1) * (cy2 - cy1)
    giou = inter / union - (hull - union) / hull
    return (1 - giou).mean()


def focal_loss(logits, targets, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    a_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (a_t * loss).sum()


class Head(nn.Module):
    def __init__(self, c=8, classes=3, anchors=2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(2, c), nn.ReLU())
        self.cls = nn.Conv2d(c, anchors * classes, 3, padding=1)
        self.reg = nn.Conv2d(c, anchors * 4, 3, padding=1)
        self.classes, self.anchors = classes, anchors

    def forward(self, x):
        f = self.stem(x)
        n, _, h, w = f.shape
        cls = self.cls(f).permute(0, 2, 3, 1).reshape(n, h * w * self.anchors, self.classes)
        reg = self.reg(f).permute(0, 2, 3, 1).reshape(n, h * w * self.anchors, 4)
        return cls, reg


def make_anchors(h, w, sizes=(2.0, 3.5)):
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32) + 0.5,
                            torch.arange(w, dtype=torch.float32) + 0.5, indexing="ij")
    centers = torch.stack([xs, ys], dim=-1).reshape(-1, 1, 2).expand(-1, len(sizes), 2)
    half = torch.tensor(sizes).reshape(1, -1, 1) / 2
    return torch.cat([centers - half, centers + half], dim=-1).reshape(-1, 4)


torch.manual_seed(0)
model = Head()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)
images = torch.randn(2, 3, 6, 6)
gt_boxes = [torch.tensor([[0.5, 0.5, 3.0, 3.5], [2.0, 1.0, 5.5, 4.0]]), torch.tensor([[1.0, 2.0, 4.0, 5.5]])]
gt_labels = [torch.tensor([0, 2]), torch.tensor([1])]
anchors = make_anchors(6, 6)
LOSSES = []
for step in range(4):
    opt.zero_grad()
    cls, reg = model(images)
    total = 0.0
    per_class = torch.zeros(3)
    for i in range(2):
        iou = box_iou(anchors, gt_boxes[i])
        best, idx = iou.max(dim=1)
        pos = best >= 0.3
        targets = torch.zeros_like(cls[i])
        targets[pos, gt_labels[i][idx[pos]]] = 1.0
        per_class.index_put_((gt_labels[i][idx[pos]],), torch.ones(int(pos.sum())), accumulate=True)
        n_pos = pos.sum().clamp(min=1).float()
        cls_loss = focal_loss(cls[i], targets) / n_pos
        deltas = reg[i][pos]
        pred_boxes = anchors[pos] + deltas * 0.5
        box_loss = giou_loss(pred_boxes, gt_boxes[i][idx[pos]])
        total = total + cls_loss + box_loss
    total.backward()
    opt.step()
    with torch.no_grad():
        scores = torch.sigmoid(cls[0]).max(dim=1).values
        top, order = scores.topk(5)
        kept = torch.sort(order).values
    LOSSES.append(total.item())
    LOSSES.append(float(per_class.sum()) + float(kept.float().mean()) * 0 + float(top.sum()))
MODELS = {"head": model}
