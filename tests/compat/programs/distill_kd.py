# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Knowledge distillation (Hinton et al.) of a small CNN teacher into a smaller student, as in the
PyTorch "Knowledge Distillation" tutorial plus the usual variants: the teacher frozen in eval mode
(requires_grad_(False), torch.inference_mode for its logits), soft targets at temperature T through
nn.KLDivLoss(reduction="batchmean") on log-probabilities with log_target=True scaled by T**2, the
same term through F.kl_div on probabilities (log_target=False), a cosine-embedding hidden-state loss
(nn.CosineEmbeddingLoss) on a projected feature, label-smoothed cross entropy with class weights,
an intermediate-feature hint loss (F.mse_loss against an adaptive_avg_pool2d'ed teacher map), SGD
with Nesterov momentum, CosineAnnealingLR after a LinearLR warm-up in SequentialLR, and an
accuracy/agreement evaluation."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Teacher(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.Conv2d(16, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(),
                                      nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(24 * 4 * 4, 32), nn.ReLU(), nn.Dropout(0.1),
                                        nn.Linear(32, num_classes))

    def forward(self, x):
        f = self.features(x)
        return self.classifier(f), f


class Student(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2))
        self.regressor = nn.Conv2d(8, 24, 1)
        self.fc = nn.Linear(8 * 4 * 4, num_classes)
        self.embed = nn.Linear(8 * 4 * 4, 16)

    def forward(self, x):
        f = self.features(x)
        flat = torch.flatten(f, 1)
        return self.fc(flat), self.regressor(f), self.embed(flat)


torch.manual_seed(13)
teacher, student = Teacher(), Student()
teacher_embed = nn.Linear(24 * 4 * 4, 16)
teacher.eval().requires_grad_(False)
teacher_embed.requires_grad_(False)
images = torch.randn(12, 3, 8, 8)
labels = torch.randint(0, 5, (12,))
# warm the teacher's BatchNorm statistics as a pre-trained teacher would have them
teacher.train()
with torch.no_grad():
    for _ in range(3):
        teacher(images + 0.1 * torch.randn_like(images))
teacher.eval()

T = 3.0
kd_loss = nn.KLDivLoss(reduction="batchmean", log_target=True)
ce_loss = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 1.0, 0.5, 1.5]), label_smoothing=0.1)
cos_loss = nn.CosineEmbeddingLoss(margin=0.1)
optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.2, total_iters=2)
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4, eta_min=1e-3)
scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[2])

LOSSES = []
for step in range(6):
    with torch.inference_mode():
        t_logits, t_feat = teacher(images)
        t_emb = teacher_embed(torch.flatten(t_feat, 1))
    t_logits, t_feat, t_emb = t_logits.clone(), t_feat.clone(), t_emb.clone()
    s_logits, s_hint, s_emb = student(images)
    soft = kd_loss(F.log_softmax(s_logits / T, dim=-1), F.log_softmax(t_logits / T, dim=-1)) * T * T
    soft_p = F.kl_div(F.log_softmax(s_logits / T, dim=-1), F.softmax(t_logits / T, dim=-1),
                      reduction="batchmean") * T * T
    hint = F.mse_loss(s_hint, F.adaptive_avg_pool2d(t_feat, s_hint.shape[-2:]))
    agree = torch.where(t_logits.argmax(-1) == labels, 1, -1)
    cos = cos_loss(s_emb, t_emb, agree)
    loss = 0.7 * soft + 0.3 * ce_loss(s_logits, labels) + 0.1 * hint + 0.05 * cos
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    LOSSES.extend([loss.item(), soft_p.item()])
LOSSES.append(scheduler.get_last_lr()[0])

student.eval()
with torch.no_grad():
    s_logits = student(images)[0]
    t_logits = teacher(images)[0]
    LOSSES.append((s_logits.argmax(1) == labels).float().mean().item())
    LOSSES.append((s_logits.argmax(1) == t_logits.argmax(1)).float().mean().item())
    LOSSES.append(F.kl_div(F.log_softmax(s_logits, 1), F.log_softmax(t_logits, 1), reduction="sum",
                           log_target=True).item())
    LOSSES.append(F.kl_div(F.log_softmax(s_logits, 1), F.softmax(t_logits, 1), reduction="none").sum().item())
MODELS = {"student": student, "teacher": teacher}
