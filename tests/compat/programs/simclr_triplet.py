# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Contrastive and metric learning (SimCLR / FaceNet style): a small CNN encoder with a projection
head, two deterministic "augmented" views, the NT-Xent (InfoNCE) loss as cross_entropy over a
temperature-scaled cosine-similarity matrix with the diagonal masked to -inf, a triplet loss with
batch-hard mining through torch.cdist, a cosine-distance TripletMarginWithDistanceLoss with
swap, a supervised-contrastive term via logsumexp and fill_diagonal_, CosineEmbeddingLoss, and a linear probe trained with
label smoothing. SGD with Nesterov momentum and MultiStepLR; ExponentialLR on the probe."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Encoder(nn.Module):
    def __init__(self, dim=24, proj_dim=16):
        super().__init__()
        self.features = nn.Sequential(
            # (average pooling: a max pool's near-ties, flipped by last-bit differences of the
            # multithreaded kernels on AVX-512 CPUs, sent whole gradients elsewhere by step 4)
            nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(inplace=True), nn.AvgPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.fc = nn.Linear(16, dim)
        self.projector = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, proj_dim))

    def forward(self, x):
        h = self.fc(self.features(x))
        return h, self.projector(h)


def nt_xent(z1, z2, temperature=0.5):
    z = F.normalize(torch.cat([z1, z2], dim=0), dim=1)
    n = z1.shape[0]
    sim = torch.matmul(z, z.T) / temperature
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


def batch_hard_triplet(embeddings, labels, margin=0.3):
    dist = torch.cdist(embeddings, embeddings, p=2)
    same = labels.unsqueeze(0) == labels.unsqueeze(1)
    eye = torch.eye(len(labels), dtype=torch.bool)
    hardest_pos = dist.masked_fill(~same | eye, 0.0).max(dim=1).values
    hardest_neg = dist.masked_fill(same, float("inf")).min(dim=1).values
    return F.relu(hardest_pos - hardest_neg + margin).mean()


def augment(x, flip):
    x = torch.flip(x, dims=[3]) if flip else x
    return torch.roll(x, shifts=1, dims=2) * 0.9 + 0.05


torch.manual_seed(5)
encoder = Encoder()
probe = nn.Linear(24, 4)
optimizer = torch.optim.SGD(encoder.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1, 3], gamma=0.5)
probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1, momentum=0.9, dampening=0.1)
probe_sched = torch.optim.lr_scheduler.ExponentialLR(probe_opt, gamma=0.8)
triplet_fn = nn.TripletMarginLoss(margin=0.5, p=2)
cos_emb = nn.CosineEmbeddingLoss(margin=0.1)
cos_triplet = nn.TripletMarginWithDistanceLoss(distance_function=lambda x, y: 1.0 - F.cosine_similarity(x, y),
                                               margin=0.2, swap=True)


def sup_con(z, labels, temperature=0.3):
    z = F.normalize(z, dim=1)
    logits = z @ z.T / temperature
    self_mask = torch.eye(len(labels), dtype=torch.bool)
    pos = (labels[:, None] == labels[None, :]).float()
    pos.fill_diagonal_(0.0)
    log_prob = logits - torch.logsumexp(logits.masked_fill(self_mask, float("-inf")), dim=1, keepdim=True)
    return -((pos * log_prob).sum(dim=1) / pos.sum(dim=1)).mean()

images = torch.rand(8, 3, 8, 8)
labels = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
LOSSES = []
for step in range(4):
    encoder.train()
    h1, z1 = encoder(augment(images, flip=True))
    h2, z2 = encoder(augment(images, flip=False))
    loss_con = nt_xent(z1, z2, temperature=0.2)
    emb = F.normalize(h1, p=2, dim=1)
    loss_hard = batch_hard_triplet(emb, labels)
    # explicit triplets: anchor i, positive i+4 (same class), negative (i+1) % 4
    anchor, positive, negative = emb[:4], emb[4:], emb[[1, 2, 3, 0]]
    loss_trip = triplet_fn(anchor, positive, negative)
    pair_target = torch.where(labels[:4] == labels[4:], 1, -1)
    loss_cos = cos_emb(h1[:4], h2[4:], pair_target)
    loss_ctrip = cos_triplet(z1[:4], z2[4:], z2[[1, 2, 3, 0]])
    loss_sup = sup_con(torch.cat([z1, z2]), torch.cat([labels, labels]))
    loss = loss_con + loss_hard + loss_trip + 0.5 * loss_cos + loss_ctrip + 0.1 * loss_sup
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()

    # linear probe on frozen features
    with torch.no_grad():
        feats = encoder(images)[0]
        agreement = F.cosine_similarity(z1, z2, dim=1).mean()
        pdist = F.pairwise_distance(emb[:4], emb[4:]).mean()
    probe_loss = F.cross_entropy(probe(feats.detach()), labels, label_smoothing=0.1)
    probe_opt.zero_grad()
    probe_loss.backward()
    probe_opt.step()
    probe_sched.step()
    LOSSES.extend([loss.item(), loss_con.item(), loss_hard.item(), loss_trip.item(), loss_cos.item(),
                   loss_ctrip.item(), loss_sup.item(), probe_loss.item(), agreement.item(), pdist.item()])
LOSSES.append(scheduler.get_last_lr()[0])
LOSSES.append(probe_sched.get_last_lr()[0])
MODELS = {"encoder": encoder, "probe": probe}
