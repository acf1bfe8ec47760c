"""Datasets shared by the measurement tests (the loading cost is what they set)."""
import time

import torch
from torch.utils.data import Dataset


class SleepyDataset(Dataset):
    """Each item sleeps: a batch of `batch` items costs about batch x item_s to load."""

    def __init__(self, n, item_s):
        self.n, self.item_s = n, item_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return torch.tensor([float(i)])
