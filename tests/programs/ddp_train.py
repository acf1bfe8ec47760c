"""A DDP-style training on CPU (gloo) under torchrun: an all-reduce of the gradients every step.

SW_SLOW=load     rank SW_SLOW_RANK sleeps in __getitem__ (its loading is slow); no step() marks
SW_SLOW=compute  rank SW_SLOW_RANK computes longer before the all-reduce; steps marked with step()
SW_SLOW=none     every rank alike
"""
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import starvewatch

SLOW = os.environ.get("SW_SLOW", "none")
SLOW_RANK = int(os.environ.get("SW_SLOW_RANK", "1"))
STEPS = int(os.environ.get("SW_STEPS", "60"))
LOAD_S, COMPUTE_S, EXTRA_S = 0.002, 0.008, 0.020

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Synthetic(Dataset):
    def __len__(self):
        return STEPS * dist.get_world_size()

    def __getitem__(self, i):
        time.sleep(LOAD_S + (EXTRA_S if SLOW == "load" and rank == SLOW_RANK else 0.0))
        return torch.full((8,), float(i)), torch.tensor([float(i % 2)])


model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sampler = DistributedSampler(Synthetic(), shuffle=False)
loader = starvewatch.watch(DataLoader(Synthetic(), batch_size=1, sampler=sampler, num_workers=0), "train")


def compute(x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    time.sleep(COMPUTE_S + (EXTRA_S if SLOW == "compute" and rank == SLOW_RANK else 0.0))


for x, y in loader:
    if SLOW == "compute":
        with starvewatch.step():  # the compute before the collective
            compute(x, y)
    else:
        compute(x, y)
    for p in model.parameters():  # what DDP does in backward: every rank waits for the slowest
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    opt.zero_grad()

summary = starvewatch.finish()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} finished {summary['loaders'][0]['steps']} steps", flush=True)
