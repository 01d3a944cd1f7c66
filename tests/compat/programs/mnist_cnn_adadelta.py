# ruff: noqa: B007  (published-style loops keep their unused counters)
"""PyTorch's MNIST example: conv/dropout/max-pool, log_softmax + nll_loss, Adadelta + StepLR."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 5 * 5, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


torch.manual_seed(1)
device = torch.device("cuda" if torch.cuda.is_available() and False else "cpu")
model = Net().to(device)
optimizer = optim.Adadelta(model.parameters(), lr=1.0)
scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
data, target = torch.randn(32, 1, 14, 14), torch.randint(0, 10, (32,))
LOSSES = []
for epoch in range(1, 3):
    model.train()
    for batch_idx in range(2):
        x, y = data[batch_idx * 16:(batch_idx + 1) * 16].to(device), target[batch_idx * 16:(batch_idx + 1) * 16]
        optimizer.zero_grad()
        loss = F.nll_loss(model(x), y)
        loss.backward()
        optimizer.step()
        LOSSES.append(loss.item())
    scheduler.step()
model.eval()
with torch.no_grad():
    out = model(data)
    LOSSES.append(F.nll_loss(out, target, reduction="sum").item())
    correct = out.argmax(dim=1, keepdim=True).eq(target.view_as(out.argmax(dim=1, keepdim=True))).sum().item()
MODELS = {"net": model}
