# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Soft Actor-Critic on a tiny continuous-control problem written in tensors, in the style of
pytorch_sac / SpinningUp: a SquashedNormal policy subclassing
torch.distributions.transformed_distribution.TransformedDistribution with a user-written TanhTransform
(subclass of torch.distributions.transforms.Transform with constraints.real / constraints.interval,
cache_size=1 so log_prob of its own rsample inverts exactly), log_std squashed into bounds with tanh,
an AffineTransform rescaling to the action bounds through a ComposeTransform, the built-in
torch.distributions.TanhTransform as a cross-check, twin Q critics with torch.min, target critics updated
by polyak averaging with torch.no_grad + mul_/add_, automatic entropy tuning through a learnable
log_alpha, separate Adam optimizers, and the actor loss backpropagating through the reparameterised
sample while the critics' gradients are cut by requires_grad_(False)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import distributions as pyd


class TanhTransform(pyd.transforms.Transform):
    domain = pyd.constraints.real
    codomain = pyd.constraints.interval(-1.0, 1.0)
    bijective = True
    sign = +1

    def __init__(self, cache_size=1):
        super().__init__(cache_size=cache_size)

    @staticmethod
    def atanh(x):
        return 0.5 * (x.log1p() - (-x).log1p())

    def __eq__(self, other):
        return isinstance(other, TanhTransform)

    def _call(self, x):
        return x.tanh()

    def _inverse(self, y):
        return self.atanh(y)

    def log_abs_det_jacobian(self, x, y):
        return 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))


class SquashedNormal(pyd.transformed_distribution.TransformedDistribution):
    def __init__(self, loc, scale, action_scale):
        self.loc, self.scale = loc, scale
        self.base_dist = pyd.Normal(loc, scale)
        transforms = [pyd.ComposeTransform([TanhTransform(), pyd.AffineTransform(0.0, action_scale)])]
        super().__init__(self.base_dist, transforms)

    @property
    def mean(self):
        mu = self.loc
        for tr in self.transforms:
            mu = tr(mu)
        return mu


class DiagGaussianActor(nn.Module):
    def __init__(self, obs_dim, action_dim, hidden, log_std_bounds=(-5.0, 2.0), action_scale=2.0):
        super().__init__()
        self.log_std_bounds, self.action_scale = log_std_bounds, action_scale
        self.trunk = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                   nn.Linear(hidden, 2 * action_dim))

    def forward(self, obs):
        mu, log_std = self.trunk(obs).chunk(2, dim=-1)
        log_std = torch.tanh(log_std)
        lo, hi = self.log_std_bounds
        log_std = lo + 0.5 * (hi - lo) * (log_std + 1)
        return SquashedNormal(mu, log_std.exp(), self.action_scale)


class DoubleQCritic(nn.Module):
    def __init__(self, obs_dim, action_dim, hidden):
        super().__init__()
        self.Q1 = nn.Sequential(nn.Linear(obs_dim + action_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.Q2 = nn.Sequential(nn.Linear(obs_dim + action_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, obs, action):
        oa = torch.cat([obs, action], dim=-1)
        return self.Q1(oa), self.Q2(oa)


def soft_update_params(net, target_net, tau):
    with torch.no_grad():
        for param, target_param in zip(net.parameters(), target_net.parameters()):
            target_param.mul_(1 - tau).add_(param, alpha=tau)


torch.manual_seed(12)
obs_dim, action_dim, batch = 4, 2, 16
actor = DiagGaussianActor(obs_dim, action_dim, 32)
critic = DoubleQCritic(obs_dim, action_dim, 32)
critic_target = DoubleQCritic(obs_dim, action_dim, 32)
critic_target.load_state_dict(critic.state_dict())
log_alpha = torch.tensor(math.log(0.1), requires_grad=True)
target_entropy = -float(action_dim)
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
alpha_opt = torch.optim.Adam([log_alpha], lr=1e-3, betas=(0.5, 0.999))
obs = torch.randn(batch, obs_dim)
next_obs = obs + 0.1 * torch.randn(batch, obs_dim)
actions = torch.rand(batch, action_dim) * 4 - 2
rewards = -(actions - obs[:, :action_dim]).pow(2).sum(-1, keepdim=True)
not_done = (torch.rand(batch, 1) > 0.1).float()
discount = 0.99

LOSSES = []
for step in range(4):
    with torch.no_grad():
        dist = actor(next_obs)
        next_action = dist.rsample()
        log_prob = dist.log_prob(next_action).sum(-1, keepdim=True)
        target_Q1, target_Q2 = critic_target(next_obs, next_action)
        target_V = torch.min(target_Q1, target_Q2) - log_alpha.exp() * log_prob
        target_Q = rewards + not_done * discount * target_V
    current_Q1, current_Q2 = critic(obs, actions)
    critic_loss = F.mse_loss(current_Q1, target_Q) + F.mse_loss(current_Q2, target_Q)
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()

    critic.requires_grad_(False)
    dist = actor(obs)
    action = dist.rsample()
    log_prob = dist.log_prob(action).sum(-1, keepdim=True)
    actor_Q1, actor_Q2 = critic(obs, action)
    actor_loss = (log_alpha.exp().detach() * log_prob - torch.min(actor_Q1, actor_Q2)).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    critic.requires_grad_(True)

    alpha_loss = (log_alpha.exp() * (-log_prob - target_entropy).detach()).mean()
    alpha_opt.zero_grad()
    alpha_loss.backward()
    alpha_opt.step()
    soft_update_params(critic, critic_target, 0.05)
    LOSSES.extend([critic_loss.item(), actor_loss.item(), alpha_loss.item(), -log_prob.mean().item()])

with torch.no_grad():
    dist = actor(obs)
    LOSSES.append(dist.mean.abs().max().item())
    sample = dist.sample((3,))
    LOSSES.append(sample.abs().max().item())
    # the library TanhTransform (no cache) agrees with the cached inverse away from the bounds
    builtin = pyd.TransformedDistribution(pyd.Normal(dist.loc, dist.scale),
                                          [pyd.TanhTransform(), pyd.AffineTransform(0.0, 2.0)])
    probe = torch.linspace(-1.5, 1.5, 2 * batch).reshape(batch, 2)
    LOSSES.append((builtin.log_prob(probe) - dist.log_prob(probe)).abs().max().item() * 100)
    LOSSES.append(builtin.log_prob(probe).sum().item())
    lognormal = pyd.LogNormal(dist.loc, dist.scale)
    LOSSES.append(lognormal.log_prob(torch.full_like(dist.loc, 0.7)).mean().item())
    LOSSES.append(lognormal.entropy().mean().item())
LOSSES.append(log_alpha.item())
MODELS = {"actor": actor, "critic": critic}
