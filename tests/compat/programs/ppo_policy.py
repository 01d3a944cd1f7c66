# ruff: noqa: B007  (published-style loops keep their unused counters)
"""PPO (CleanRL's ppo.py, scaled down) on a synthetic vectorized environment with a hybrid action space:
an actor-critic MLP with orthogonal init (nn.init.orthogonal_ with gains, constant_ biases), a discrete head
(torch.distributions.Categorical(logits=...)) and a continuous head (Independent(Normal(mean, exp(log_std)), 1)
with a state-independent nn.Parameter log_std); rollouts sampled under torch.no_grad, GAE computed with a
reversed loop over time, advantage normalization per minibatch, several epochs over minibatches shuffled
with torch.randperm, the clipped surrogate (ratio, torch.clamp, torch.max of the negated objectives), a
clipped value loss, entropy bonus, approx-KL and clip fractions, kl_divergence between the old and new
Categorical, linear learning-rate annealing through optimizer.param_groups, clip_grad_norm_, and a
deterministic evaluation with the distributions' mode."""
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical, Independent, Normal, kl_divergence


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, n_discrete, cont_dim, hidden=16):
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh(),
                                    layer_init(nn.Linear(hidden, hidden)), nn.Tanh(),
                                    layer_init(nn.Linear(hidden, 1), std=1.0))
        self.actor_body = nn.Sequential(layer_init(nn.Linear(obs_dim, hidden)), nn.Tanh(),
                                        layer_init(nn.Linear(hidden, hidden)), nn.Tanh())
        self.logits_head = layer_init(nn.Linear(hidden, n_discrete), std=0.01)
        self.mean_head = layer_init(nn.Linear(hidden, cont_dim), std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, cont_dim))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None, cont=None):
        h = self.actor_body(x)
        cat = Categorical(logits=self.logits_head(h))
        mean = self.mean_head(h)
        std = torch.exp(self.actor_logstd.expand_as(mean))
        gauss = Independent(Normal(mean, std), 1)
        if action is None:
            action, cont = cat.sample(), gauss.sample()
        logprob = cat.log_prob(action) + gauss.log_prob(cont)
        entropy = cat.entropy() + gauss.entropy()
        return action, cont, logprob, entropy, self.critic(x), cat.logits


class ToyVecEnv:
    """num_envs point masses: the discrete action picks a push direction, the continuous one a force."""

    def __init__(self, num_envs, obs_dim, horizon=5):
        self.num_envs, self.obs_dim, self.horizon = num_envs, obs_dim, horizon
        self.directions = torch.linspace(-1, 1, 3)

    def reset(self):
        self.t = torch.zeros(self.num_envs, dtype=torch.long)
        self.obs = torch.randn(self.num_envs, self.obs_dim)
        return self.obs.clone()

    def step(self, action, cont):
        push = self.directions[action].unsqueeze(1) + 0.3 * torch.tanh(cont).mean(1, keepdim=True)
        self.obs = 0.9 * self.obs - 0.2 * push + 0.05 * torch.randn_like(self.obs)
        reward = -self.obs.pow(2).sum(1) - 0.01 * cont.pow(2).sum(1)
        self.t += 1
        done = self.t >= self.horizon
        if done.any():
            self.obs[done] = torch.randn(int(done.sum()), self.obs_dim)
            self.t[done] = 0
        return self.obs.clone(), reward, done.float()


torch.manual_seed(1)
num_envs, num_steps, obs_dim, n_discrete, cont_dim = 4, 8, 4, 3, 2
gamma, gae_lambda, clip_coef, ent_coef, vf_coef, max_grad_norm = 0.99, 0.95, 0.2, 0.01, 0.5, 0.5
update_epochs, num_minibatches, num_iterations, learning_rate = 2, 4, 3, 3e-3
batch_size = num_envs * num_steps
minibatch_size = batch_size // num_minibatches
env = ToyVecEnv(num_envs, obs_dim)
agent = Agent(obs_dim, n_discrete, cont_dim)
optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5)

obs = torch.zeros((num_steps, num_envs, obs_dim))
actions = torch.zeros((num_steps, num_envs), dtype=torch.long)
conts = torch.zeros((num_steps, num_envs, cont_dim))
logprobs = torch.zeros((num_steps, num_envs))
rewards = torch.zeros((num_steps, num_envs))
dones = torch.zeros((num_steps, num_envs))
values = torch.zeros((num_steps, num_envs))
old_logits = torch.zeros((num_steps, num_envs, n_discrete))

LOSSES = []
next_obs, next_done = env.reset(), torch.zeros(num_envs)
for iteration in range(1, num_iterations + 1):
    frac = 1.0 - (iteration - 1.0) / num_iterations
    optimizer.param_groups[0]["lr"] = frac * learning_rate
    for step in range(num_steps):
        obs[step], dones[step] = next_obs, next_done
        with torch.no_grad():
            action, cont, logprob, _, value, logits = agent.get_action_and_value(next_obs)
            values[step] = value.flatten()
        actions[step], conts[step], logprobs[step], old_logits[step] = action, cont, logprob, logits
        next_obs, reward, next_done = env.step(action, cont)
        rewards[step] = reward.view(-1)
    with torch.no_grad():
        next_value = agent.get_value(next_obs).reshape(1, -1)
        advantages = torch.zeros_like(rewards)
        lastgaelam = 0
        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                nextnonterminal = 1.0 - next_done
                nextvalues = next_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]
                nextvalues = values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values

    b_obs, b_actions = obs.reshape((-1, obs_dim)), actions.reshape(-1)
    b_conts, b_logprobs = conts.reshape((-1, cont_dim)), logprobs.reshape(-1)
    b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
    b_old_logits = old_logits.reshape(-1, n_discrete)
    clipfracs = []
    for epoch in range(update_epochs):
        b_inds = torch.randperm(batch_size)
        for start in range(0, batch_size, minibatch_size):
            mb_inds = b_inds[start:start + minibatch_size]
            _, _, newlogprob, entropy, newvalue, new_logits = agent.get_action_and_value(
                b_obs[mb_inds], b_actions[mb_inds], b_conts[mb_inds])
            logratio = newlogprob - b_logprobs[mb_inds]
            ratio = logratio.exp()
            with torch.no_grad():
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfracs += [((ratio - 1.0).abs() > clip_coef).float().mean().item()]
                cat_kl = kl_divergence(Categorical(logits=b_old_logits[mb_inds]), Categorical(logits=new_logits)).mean()
            mb_advantages = b_advantages[mb_inds]
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            newvalue = newvalue.view(-1)
            v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
            v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -clip_coef, clip_coef)
            v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - ent_coef * entropy_loss + v_loss * vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
            optimizer.step()
            LOSSES.append(loss.item())
    y_pred, y_true = b_values, b_returns
    var_y = torch.var(y_true)
    explained_var = float("nan") if var_y == 0 else (1 - torch.var(y_true - y_pred) / var_y).item()
    LOSSES += [pg_loss.item(), v_loss.item(), entropy_loss.item(), old_approx_kl.item(), approx_kl.item(),
               float(np.mean(clipfracs)), cat_kl.item(), explained_var, rewards.sum().item(),
               optimizer.param_groups[0]["lr"]]
# deterministic evaluation: the most likely discrete action and the Gaussian's mode
with torch.no_grad():
    eval_obs, eval_return = env.reset(), torch.zeros(num_envs)
    for t in range(env.horizon):
        h = agent.actor_body(eval_obs)
        mean = agent.mean_head(h)
        action = Categorical(logits=agent.logits_head(h)).mode
        cont = Independent(Normal(mean, agent.actor_logstd.exp().expand_as(mean)), 1).mode
        eval_obs, reward, _ = env.step(action, cont)
        eval_return += reward
LOSSES.append(eval_return.mean().item())
MODELS = {"agent": agent}
