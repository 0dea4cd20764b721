"""A user's own accelerate script, written as many are (held out: no example of the tool
looks like it): module-level code, 5 steps, every rank prints its result, and no
destroy_process_group() at the end."""
import torch
from accelerate import Accelerator
from torch import nn

acc = Accelerator()
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
for _step in range(5):
    x = torch.randn(8, 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    acc.backward(loss)
    opt.step()
total = acc.reduce(loss.detach(), reduction="mean")
print(f"rank {acc.process_index}/{acc.num_processes} result {total.item():.4f}", flush=True)
