# ruff: noqa: B007  (published-style loops keep their unused counters)
"""WGAN-GP (Gulrajani et al.) in the style of the common PyTorch implementations: a conv generator
(ConvTranspose2d + BatchNorm2d), a critic with spectral-normalized convs (torch.nn.utils.parametrizations.spectral_norm
and the older torch.nn.utils.spectral_norm hook) and LayerNorm-free LeakyReLU, the gradient penalty from
torch.autograd.grad(create_graph=True, grad_outputs=ones) on random interpolates, n_critic critic steps per
generator step with RMSprop for the critic and Adam(betas=(0.0, 0.9)) for the generator, requires_grad_ toggling
to freeze the critic during the generator update."""
import torch
import torch.nn as nn
from torch.nn.utils import parametrizations

nz, ngf, ndf, nc, img = 8, 8, 8, 1, 8


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(nz, ngf * 2 * 2 * 2)
        self.net = nn.Sequential(
            nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1), nn.Tanh())

    def forward(self, z):
        return self.net(self.fc(z).view(-1, ngf * 2, 2, 2))


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            parametrizations.spectral_norm(nn.Conv2d(nc, ndf, 3, 2, 1)), nn.LeakyReLU(0.2),
            nn.utils.spectral_norm(nn.Conv2d(ndf, ndf * 2, 3, 2, 1)), nn.LeakyReLU(0.2),
            nn.Flatten(), nn.Linear(ndf * 2 * 2 * 2, 1))

    def forward(self, x):
        return self.net(x).view(-1)


def gradient_penalty(critic, real, fake):
    alpha = torch.rand(real.size(0), 1, 1, 1).expand_as(real)
    interpolates = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    out = critic(interpolates)
    grads = torch.autograd.grad(outputs=out, inputs=interpolates, grad_outputs=torch.ones_like(out),
                                create_graph=True, retain_graph=True, only_inputs=True)[0]
    grads = grads.view(grads.size(0), -1)
    return ((grads.norm(2, dim=1) - 1) ** 2).mean()


torch.manual_seed(1234)
netG, netC = Generator(), Critic()
optC = torch.optim.RMSprop(netC.parameters(), lr=5e-4, alpha=0.9)
optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.0, 0.9))
lambda_gp, n_critic, batch = 10.0, 2, 6
data = torch.tanh(torch.randn(24, nc, img, img))
LOSSES = []
for it in range(3):
    for p in netC.parameters():
        p.requires_grad_(True)
    for _ in range(n_critic):
        idx = torch.randint(0, data.size(0), (batch,))
        real = data[idx]
        z = torch.randn(batch, nz)
        with torch.no_grad():
            fake = netG(z)
        netC.zero_grad()
        d_real, d_fake = netC(real).mean(), netC(fake).mean()
        gp = gradient_penalty(netC, real, fake)
        loss_c = d_fake - d_real + lambda_gp * gp
        loss_c.backward()
        optC.step()
        LOSSES += [loss_c.item(), gp.item()]
    for p in netC.parameters():
        p.requires_grad_(False)
    netG.zero_grad()
    loss_g = -netC(netG(torch.randn(batch, nz))).mean()
    loss_g.backward()
    optG.step()
    LOSSES.append(loss_g.item())
for p in netC.parameters():
    p.requires_grad_(True)
# the compared gradients: one more critic step's backward (includes the double-backward of the penalty)
netC.zero_grad()
real, fake = data[:batch], netG(torch.randn(batch, nz)).detach()
(netC(fake).mean() - netC(real).mean() + lambda_gp * gradient_penalty(netC, real, fake)).backward()
netC.eval()
with torch.no_grad():
    LOSSES.append(netC(data[:4]).mean().item())
sn = netC.net[0].parametrizations.weight.original
LOSSES.append(torch.linalg.matrix_norm(netC.net[0].weight.flatten(1), ord=2).item())
LOSSES.append(sn.abs().sum().item())
MODELS = {"G": netG, "C": netC}
