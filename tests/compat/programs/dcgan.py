# ruff: noqa: B007  (published-style loops keep their unused counters)
"""PyTorch's DCGAN example (scaled down): ConvTranspose2d generator with BatchNorm/ReLU/Tanh,
Conv2d discriminator with LeakyReLU(inplace)/Sigmoid, weights_init via apply, BCELoss, two Adam
optimizers with beta1=0.5, fake.detach() for the discriminator step."""
import torch
import torch.nn as nn
import torch.optim as optim

nz, ngf, ndf, nc = 8, 8, 8, 3


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


torch.manual_seed(999)
netG, netD = Generator(), Discriminator()
netG.apply(weights_init)
netD.apply(weights_init)
criterion = nn.BCELoss()
fixed_noise = torch.randn(4, nz, 1, 1)
real_label, fake_label = 1.0, 0.0
optimizerD = optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
real = torch.rand(4, nc, 16, 16) * 2 - 1
LOSSES = []
for i in range(3):
    netD.zero_grad()
    label = torch.full((4,), real_label, dtype=torch.float)
    errD_real = criterion(netD(real), label)
    errD_real.backward()
    noise = torch.randn(4, nz, 1, 1)
    fake = netG(noise)
    label.fill_(fake_label)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    label.fill_(real_label)
    errG = criterion(netD(fake), label)
    errG.backward()
    optimizerG.step()
    LOSSES += [(errD_real + errD_fake).item(), errG.item()]
with torch.no_grad():
    LOSSES.append(netG(fixed_noise).detach().abs().mean().item())
MODELS = {"G": netG, "D": netD}
