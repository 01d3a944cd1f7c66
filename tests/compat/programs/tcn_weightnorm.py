# ruff: noqa: B007  (published-style loops keep their unused counters)
"""A temporal convolutional network (Bai et al., "An Empirical Evaluation of Generic Convolutional and
Recurrent Networks", the locuslab TCN code) on a copy-memory style sequence task: dilated causal
Conv1d layers (padding then a Chomp1d slice), torch.nn.utils.weight_norm (the legacy hook) on the
first conv of each block and torch.nn.utils.parametrizations.weight_norm on the second, a 1x1
downsample with spectral_norm on the residual path, ReLU + Dropout, weights drawn with
normal_(0, 0.01), a linear head over the last time step plus a per-step head with F.pad'ed targets,
CrossEntropyLoss over (N, C, L) logits, RMSprop with momentum and centered=True, MultiStepLR,
remove_weight_norm afterwards with an equal-output check under torch.no_grad."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations, remove_weight_norm, spectral_norm, weight_norm


class Chomp1d(nn.Module):
    def __init__(self, chomp_size):
        super().__init__()
        self.chomp_size = chomp_size

    def forward(self, x):
        return x[:, :, :-self.chomp_size].contiguous()


class TemporalBlock(nn.Module):
    def __init__(self, n_inputs, n_outputs, kernel_size, stride, dilation, padding, dropout=0.1):
        super().__init__()
        self.conv1 = weight_norm(nn.Conv1d(n_inputs, n_outputs, kernel_size, stride=stride, padding=padding,
                                           dilation=dilation))
        self.chomp1 = Chomp1d(padding)
        self.relu1 = nn.ReLU()
        self.dropout1 = nn.Dropout(dropout)
        self.conv2 = parametrizations.weight_norm(nn.Conv1d(n_outputs, n_outputs, kernel_size, stride=stride,
                                                            padding=padding, dilation=dilation))
        self.chomp2 = Chomp1d(padding)
        self.relu2 = nn.ReLU()
        self.dropout2 = nn.Dropout(dropout)
        self.net = nn.Sequential(self.conv1, self.chomp1, self.relu1, self.dropout1,
                                 self.conv2, self.chomp2, self.relu2, self.dropout2)
        self.downsample = spectral_norm(nn.Conv1d(n_inputs, n_outputs, 1)) if n_inputs != n_outputs else None
        self.relu = nn.ReLU()
        self.init_weights()

    def init_weights(self):
        self.conv1.weight_v.data.normal_(0, 0.01)
        with torch.no_grad():
            self.conv2.parametrizations.weight.original1.normal_(0, 0.01)
        if self.downsample is not None:
            self.downsample.weight_orig.data.normal_(0, 0.01)

    def forward(self, x):
        out = self.net(x)
        res = x if self.downsample is None else self.downsample(x)
        return self.relu(out + res)


class TCN(nn.Module):
    def __init__(self, input_size, output_size, num_channels, kernel_size=3, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(input_size, 6)
        layers = []
        for i, out_ch in enumerate(num_channels):
            dilation = 2 ** i
            in_ch = 6 if i == 0 else num_channels[i - 1]
            layers.append(TemporalBlock(in_ch, out_ch, kernel_size, stride=1, dilation=dilation,
                                        padding=(kernel_size - 1) * dilation, dropout=dropout))
        self.network = nn.Sequential(*layers)
        self.step_head = nn.Conv1d(num_channels[-1], output_size, 1)
        self.linear = nn.Linear(num_channels[-1], output_size)

    def forward(self, tokens):
        y = self.network(self.embed(tokens).transpose(1, 2))      # (N, C, L)
        return self.linear(y[:, :, -1]), self.step_head(y)


torch.manual_seed(8)
vocab, seq_len, batch = 6, 16, 8
model = TCN(vocab, vocab, [12, 12, 10])
optimizer = torch.optim.RMSprop(model.parameters(), lr=2e-3, alpha=0.9, momentum=0.5, centered=True)
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[2, 4], gamma=0.3)
criterion = nn.CrossEntropyLoss()
seqs = torch.randint(1, vocab, (batch, seq_len))
final_target = seqs[:, 0]
step_target = F.pad(seqs[:, :-1], (1, 0), value=0)            # predict the previous token, 0 first

LOSSES = []
model.train()
for step in range(5):
    last_logits, step_logits = model(seqs)
    loss = criterion(last_logits, final_target) + criterion(step_logits, step_target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    LOSSES.append(loss.item())
LOSSES.append(model.network[0].conv1.weight_g.norm().item())
LOSSES.append(model.network[1].conv2.parametrizations.weight.original0.norm().item())
LOSSES.append(model.network[0].downsample.weight_u.norm().item())

model.eval()
with torch.no_grad():
    before = model(seqs)[1]
    LOSSES.append(before.abs().mean().item())
    LOSSES.append((before.argmax(dim=1) == step_target).float().mean().item())
# the last backward, compared below, runs while every reparametrization is still attached
model.train()
optimizer.zero_grad()
last_logits, step_logits = model(seqs)
(criterion(last_logits, final_target) + criterion(step_logits, step_target)).backward()
EVAL = TCN(vocab, vocab, [12, 12, 10])
EVAL.load_state_dict(model.state_dict())
EVAL.eval()
for block in EVAL.network:
    remove_weight_norm(block.conv1)
    parametrizations_module = block.conv2
    torch.nn.utils.parametrize.remove_parametrizations(parametrizations_module, "weight")
with torch.no_grad():
    LOSSES.append((EVAL(seqs)[1] - before).abs().max().item())
MODELS = {"tcn": model}
