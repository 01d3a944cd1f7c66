# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A Dreamer-style world model and actor-critic, as model-based RL code writes it: a recurrent
state-space model stepping an LSTMCell over time with discrete latents drawn from
OneHotCategoricalStraightThrough (unimix probabilities), the KL between posterior and prior with
free bits and stop-gradients both ways (kl_divergence of Independent(OneHotCategorical)),
symlog targets and a two-hot reward head over bucketize'd bins, imagined rollouts whose
lambda-returns are computed backwards (flip, a Python loop), a discount cumprod, an actor with
a straight-through entropy bonus, percentile return normalisation (torch.quantile), and three
optimizers on one backward each."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Independent, OneHotCategorical, OneHotCategoricalStraightThrough, kl_divergence

OBS, ACT, HID, GROUPS, CLASSES, T, B, H = 5, 3, 12, 3, 4, 6, 4, 5
BINS = torch.linspace(-5, 5, 11)


def symlog(x):
    return torch.sign(x) * torch.log1p(x.abs())


def two_hot(x):
    idx = torch.bucketize(x.clamp(BINS[0], BINS[-1]), BINS).clamp(1, len(BINS) - 1)
    lo, hi = BINS[idx - 1], BINS[idx]
    w_hi = ((x - lo) / (hi - lo)).clamp(0, 1)
    return F.one_hot(idx - 1, len(BINS)) * (1 - w_hi)[:, None] + F.one_hot(idx, len(BINS)) * w_hi[:, None]


def latent_dist(logits, unimix=0.01):
    probs = logits.view(*logits.shape[:-1], GROUPS, CLASSES).softmax(-1)
    probs = (1 - unimix) * probs + unimix / CLASSES
    return Independent(OneHotCategoricalStraightThrough(probs=probs), 1)


class WorldModel(nn.Module):
    def __init__(self):
        super().__init__()
        z = GROUPS * CLASSES
        self.cell = nn.LSTMCell(z + ACT, HID)
        self.prior = nn.Linear(HID, z)
        self.post = nn.Linear(HID + OBS, z)
        self.reward = nn.Linear(HID + z, len(BINS))
        self.decoder = nn.Linear(HID + z, OBS)

    def observe(self, obs, act):
        h, c = torch.zeros(obs.shape[1], HID), torch.zeros(obs.shape[1], HID)
        z = torch.zeros(obs.shape[1], GROUPS * CLASSES)
        feats, posts, priors = [], [], []
        for t in range(obs.shape[0]):
            h, c = self.cell(torch.cat([z, act[t]], -1), (h, c))
            prior_logits, post_logits = self.prior(h), self.post(torch.cat([h, obs[t]], -1))
            z = latent_dist(post_logits).rsample().flatten(-2)
            feats.append(torch.cat([h, z], -1))
            posts.append(post_logits)
            priors.append(prior_logits)
        return torch.stack(feats), torch.stack(posts), torch.stack(priors), (h, c, z)

    def imagine(self, actor, state, horizon):
        h, c, z = state
        feats, ents = [], []
        for _ in range(horizon):
            feat = torch.cat([h, z], -1)
            dist = OneHotCategoricalStraightThrough(logits=actor(feat.detach()))
            a = dist.rsample()
            ents.append(dist.entropy())
            h, c = self.cell(torch.cat([z, a], -1), (h, c))
            z = latent_dist(self.prior(h)).rsample().flatten(-2)
            feats.append(torch.cat([h, z], -1))
        return torch.stack(feats), torch.stack(ents)


def kl_loss(post_logits, prior_logits, free=1.0):
    def dist(logits):
        return Independent(OneHotCategorical(logits=logits.view(*logits.shape[:-1], GROUPS, CLASSES)), 1)
    rep = kl_divergence(dist(post_logits), dist(prior_logits.detach())).clamp(min=free)
    dyn = kl_divergence(dist(post_logits.detach()), dist(prior_logits)).clamp(min=free)
    return (0.1 * rep + 0.5 * dyn).mean()


def lambda_returns(rewards, values, discount=0.97, lam=0.95):
    out, last = [], values[-1]
    for t in reversed(range(rewards.shape[0])):
        last = rewards[t] + discount * ((1 - lam) * values[t] + lam * last)
        out.append(last)
    return torch.stack(out).flip(0)


torch.manual_seed(0)
wm = WorldModel()
actor = nn.Sequential(nn.Linear(HID + GROUPS * CLASSES, 16), nn.ELU(), nn.Linear(16, ACT))
critic = nn.Sequential(nn.Linear(HID + GROUPS * CLASSES, 16), nn.ELU(), nn.Linear(16, len(BINS)))
opts = [torch.optim.Adam(m.parameters(), lr=1e-3, eps=1e-6) for m in (wm, actor, critic)]

g = torch.Generator().manual_seed(11)
LOSSES = []
for step in range(3):
    obs = torch.randn(T, B, OBS, generator=g)
    act = F.one_hot(torch.randint(0, ACT, (T, B), generator=g), ACT).float()
    rew = torch.randn(T, B, generator=g) * 3
    feats, posts, priors, state = wm.observe(obs, act)
    recon = F.mse_loss(wm.decoder(feats), symlog(obs))
    rew_logits = wm.reward(feats).flatten(0, 1)
    rew_loss = -(two_hot(symlog(rew.flatten())) * F.log_softmax(rew_logits, -1)).sum(-1).mean()
    wm_loss = recon + rew_loss + kl_loss(posts, priors)
    opts[0].zero_grad()
    wm_loss.backward()
    opts[0].step()

    start = tuple(s.detach() for s in state)
    img, ents = wm.imagine(actor, start, H)
    img_rew = (wm.reward(img).softmax(-1) * BINS).sum(-1)
    values = (critic(img).softmax(-1) * BINS).sum(-1)
    rets = lambda_returns(img_rew, values)
    weights = torch.cumprod(torch.cat([torch.ones(1, B), torch.full((H - 1, B), 0.97)]), 0)
    scale = (torch.quantile(rets.detach(), 0.95) - torch.quantile(rets.detach(), 0.05)).clamp(min=1.0)
    actor_loss = -(weights * (rets / scale + 3e-4 * ents)).mean()
    opts[1].zero_grad()
    actor_loss.backward()
    opts[1].step()

    critic_logits = critic(img.detach())
    critic_loss = -(two_hot(rets.detach().flatten()) * F.log_softmax(critic_logits.flatten(0, 1), -1)).sum(-1).mean()
    opts[2].zero_grad()
    critic_loss.backward()
    opts[2].step()
    LOSSES += [wm_loss.item(), actor_loss.item(), critic_loss.item()]

MODELS = {"world_model": wm, "actor": actor, "critic": critic}
