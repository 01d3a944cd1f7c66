# ruff: noqa: B007  (published-style loops keep their unused counters)
"""Deep Q-learning in the style of PyTorch's "Reinforcement Learning (DQN) Tutorial" on a tiny
deterministic grid world written in tensors: a replay memory of namedtuple Transitions sampled with
torch.randint, epsilon-greedy actions (torch.rand against an exponentially decaying epsilon,
max(1).indices), Q(s, a) through Tensor.gather, a non-final mask and next-state values from a target
network (max(1).values under torch.no_grad, written with masked index assignment), Double-DQN action
selection as a variant, SmoothL1Loss, AdamW(amsgrad=True), clip_grad_value_ in place, and the soft
target update through state_dict() / load_state_dict() every step plus a hard copy_ at the end, and
a Dueling head (value + advantage - advantage.mean)."""
import math
import random
from collections import deque, namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))


class ReplayMemory:
    def __init__(self, capacity):
        self.memory = deque([], maxlen=capacity)

    def push(self, *args):
        self.memory.append(Transition(*args))

    def sample(self, batch_size):
        idx = torch.randint(0, len(self.memory), (batch_size,)).tolist()
        return [self.memory[i] for i in idx]

    def __len__(self):
        return len(self.memory)


class DuelingDQN(nn.Module):
    def __init__(self, n_observations, n_actions):
        super().__init__()
        self.layer1 = nn.Linear(n_observations, 32)
        self.layer2 = nn.Linear(32, 32)
        self.value = nn.Linear(32, 1)
        self.advantage = nn.Linear(32, n_actions)

    def forward(self, x):
        x = F.relu(self.layer1(x))
        x = F.relu(self.layer2(x))
        adv = self.advantage(x)
        return self.value(x) + adv - adv.mean(dim=1, keepdim=True)


class GridWorld:
    """A 4x4 grid; the agent moves up/down/left/right, the goal is the far corner."""
    moves = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])

    def reset(self):
        self.pos = torch.tensor([0, 0])
        self.t = 0
        return self.observe()

    def observe(self):
        obs = torch.zeros(16)
        obs[self.pos[0] * 4 + self.pos[1]] = 1.0
        return obs.unsqueeze(0)

    def step(self, action):
        self.pos = (self.pos + self.moves[action]).clamp(0, 3)
        self.t += 1
        done = bool((self.pos == 3).all()) or self.t >= 12
        reward = 1.0 if bool((self.pos == 3).all()) else -0.05
        return self.observe(), reward, done


BATCH_SIZE, GAMMA, EPS_START, EPS_END, EPS_DECAY, TAU, LR = 16, 0.9, 0.9, 0.05, 50, 0.05, 1e-3
random.seed(0)
torch.manual_seed(2)
env = GridWorld()
policy_net = DuelingDQN(16, 4)
target_net = DuelingDQN(16, 4)
target_net.load_state_dict(policy_net.state_dict())
optimizer = torch.optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
memory = ReplayMemory(200)
steps_done = 0


def select_action(state):
    global steps_done
    eps_threshold = EPS_END + (EPS_START - EPS_END) * math.exp(-1.0 * steps_done / EPS_DECAY)
    steps_done += 1
    if torch.rand(()).item() > eps_threshold:
        with torch.no_grad():
            return policy_net(state).max(1).indices.view(1, 1)
    return torch.randint(0, 4, (1, 1))


def optimize_model(double):
    transitions = memory.sample(BATCH_SIZE)
    batch = Transition(*zip(*transitions))
    non_final_mask = torch.tensor(tuple(s is not None for s in batch.next_state), dtype=torch.bool)
    non_final_next_states = torch.cat([s for s in batch.next_state if s is not None])
    state_batch = torch.cat(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)
    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(BATCH_SIZE)
    with torch.no_grad():
        if double:
            best = policy_net(non_final_next_states).argmax(dim=1, keepdim=True)
            next_state_values[non_final_mask] = target_net(non_final_next_states).gather(1, best).squeeze(1)
        else:
            next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
    expected_state_action_values = (next_state_values * GAMMA) + reward_batch
    criterion = nn.SmoothL1Loss()
    loss = criterion(state_action_values, expected_state_action_values.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()
    return loss.item(), state_action_values.mean().item()


LOSSES = []
for i_episode in range(3):
    state = env.reset()
    for t in range(12):
        action = select_action(state)
        observation, reward, terminated = env.step(action.item())
        next_state = None if terminated else observation
        memory.push(state, action, next_state, torch.tensor([reward]))
        state = observation
        if len(memory) >= BATCH_SIZE:
            LOSSES.extend(optimize_model(double=i_episode == 2))
            target_net_state_dict = target_net.state_dict()
            policy_net_state_dict = policy_net.state_dict()
            for key in policy_net_state_dict:
                target_net_state_dict[key] = policy_net_state_dict[key] * TAU + target_net_state_dict[key] * (1 - TAU)
            target_net.load_state_dict(target_net_state_dict)
        if terminated:
            break
    LOSSES.append(float(len(memory)))
with torch.no_grad():
    for tp, pp in zip(target_net.parameters(), policy_net.parameters()):
        tp.copy_(pp)
    LOSSES.append(target_net(torch.eye(16)).max(1).values.mean().item())
MODELS = {"policy": policy_net}
