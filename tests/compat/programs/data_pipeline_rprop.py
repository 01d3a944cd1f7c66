# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A data pipeline as PyTorch tutorials build one: a Dataset of variable-length sequences,
random_split with a seeded Generator, ConcatDataset + Subset, a WeightedRandomSampler, a
collate_fn with pad_sequence, then a GRU knowledge-tracing model over packed sequences
(pack_padded_sequence with enforce_sorted=False); Rprop for one model and SGD(maximize=True)
on a negated objective for another."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, WeightedRandomSampler, random_split


class Sequences(Dataset):
    def __init__(self, n, offset):
        g = torch.Generator().manual_seed(offset)
        self.items = [(torch.randint(1, 9, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g),
                       torch.randint(0, 2, (1,), generator=g).float()) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    seqs, labels = zip(*batch)
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, torch.cat(labels)


class Tracer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6, padding_idx=0)
        self.gru = nn.GRU(6, 8, batch_first=True, num_layers=2)
        self.out = nn.Linear(8, 1)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        out, h = self.gru(packed)
        padded, _ = pad_packed_sequence(out, batch_first=True)
        mask = (torch.arange(padded.shape[1])[None, :] < lengths[:, None]).unsqueeze(-1)
        return self.out(h[-1]).squeeze(-1), (padded * mask).sum(1) / lengths[:, None]


torch.manual_seed(0)
data = ConcatDataset([Sequences(10, 1), Sequences(6, 2)])
train, rest = random_split(data, [12, 4], generator=torch.Generator().manual_seed(3))
train = Subset(train, list(range(10)))
weights = torch.tensor([1.0 if data[train.dataset.indices[i]][1].item() else 3.0 for i in train.indices])
sampler = WeightedRandomSampler(weights, num_samples=8, replacement=True, generator=torch.Generator().manual_seed(4))
loader = DataLoader(train, batch_size=4, sampler=sampler, collate_fn=collate)
model = Tracer()
critic = nn.Linear(8, 1)
opt = torch.optim.Rprop(model.parameters(), lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-5, 1.0))
opt_c = torch.optim.SGD(critic.parameters(), lr=0.05, maximize=True)
LOSSES = []
for epoch in range(2):
    for x, lengths, y in loader:
        opt.zero_grad()
        opt_c.zero_grad()
        logit, pooled = model(x, lengths)
        loss = F.binary_cross_entropy_with_logits(logit, y)
        objective = -F.mse_loss(critic(pooled.detach()).squeeze(-1), y)
        (loss - objective).backward()
        opt.step()
        opt_c.step()
        LOSSES.append(loss.item())
MODELS = {"tracer": model, "critic": critic}
