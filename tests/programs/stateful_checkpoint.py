"""A watched torchdata StatefulDataLoader checkpointed mid-epoch, in its own process: takes
`sys.argv[2]` batches, saves the loader's state_dict() to `sys.argv[1]` with torch.save, and
prints the batches it took and the summary's step count (one JSON line)."""
import json
import sys

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import starvewatch


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor([float(i)])


def main() -> None:
    path, taken = sys.argv[1], int(sys.argv[2])
    loader = starvewatch.watch(StatefulDataLoader(Numbers(), batch_size=4, num_workers=2), "train")
    it = iter(loader)
    batches = [next(it).tolist() for _ in range(taken)]
    torch.save(loader.state_dict(), path)
    summary = starvewatch.finish()
    print(json.dumps({"batches": batches, "steps": summary["loaders"][0]["steps"],
                      "watched_type": type(loader).__name__}))


if __name__ == "__main__":
    main()
