# ruff: noqa: B007  (published-style loops keep their unused counters)
"""PyTorch's VAE example: encoder/decoder MLPs, reparameterization with randn_like, BCE + KLD
loss, Adam; plus the KL term via torch.distributions as a cross-check."""
import torch
import torch.utils.data
from torch import nn, optim
from torch.distributions import Normal, kl_divergence
from torch.nn import functional as F


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 4)
        self.fc22 = nn.Linear(32, 4)
        self.fc3 = nn.Linear(4, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


torch.manual_seed(1)
model = VAE()
optimizer = optim.Adam(model.parameters(), lr=1e-3)
data = torch.rand(16, 1, 8, 8)
LOSSES = []
model.train()
for batch_idx in range(3):
    optimizer.zero_grad()
    recon_batch, mu, logvar = model(data)
    loss = loss_function(recon_batch, data, mu, logvar)
    kl = kl_divergence(Normal(mu, (0.5 * logvar).exp()), Normal(torch.zeros_like(mu), torch.ones_like(mu))).sum()
    assert torch.allclose(kl, -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()), rtol=1e-4, atol=1e-4)
    loss.backward()
    optimizer.step()
    LOSSES.append(loss.item() / len(data))
with torch.no_grad():
    sample = model.decode(torch.randn(4, 4))
    LOSSES.append(sample.sum().item())
MODELS = {"vae": model}
