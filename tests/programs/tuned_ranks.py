"""Two ranks under torchrun (gloo, CPU) tuning one DataLoader with a DistributedSampler:
rank 0 decides, every rank applies at the same step (tests/test_live_tuning_ranks.py).
Each rank writes what it ran to $SW_OUT/rank<r>.json."""
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import starvewatch
from starvewatch.analysis import live_tuning
from starvewatch.hooks.live_tuner import LoaderTuner

# Every change kept (the decisions are under test elsewhere; here: that they are the same on
# every rank), from the plan's own candidates, within 2 cores.
live_tuning.speedup_interval = lambda a, b: {"speedup": 1.75, "low": 1.5, "high": 2.0, "basis": "samples/s"}
LoaderTuner._advice = lambda self: []
import starvewatch.cpus  # noqa: E402
starvewatch.cpus.usable_cores = lambda *a, **k: 2


class Indices(Dataset):
    def __len__(self):
        return 128

    def __getitem__(self, i):
        return i


def fail_on_the_failing_rank(worker_id: int) -> None:
    if os.environ.get("RANK") == os.environ.get("SW_FAIL_RANK"):
        raise RuntimeError("this rank's workers cannot start")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    starvewatch.init(os.environ["STARVEWATCH_RUN_NAME"])
    sampler = DistributedSampler(Indices(), shuffle=True, seed=3)
    loader = starvewatch.watch(DataLoader(Indices(), batch_size=4, sampler=sampler,
                                          worker_init_fn=fail_on_the_failing_rank), "train", tune=True)
    epochs = []
    for epoch in range(int(os.environ.get("SW_EPOCHS", "8"))):
        sampler.set_epoch(epoch)
        seen = []
        for batch in loader:
            seen += batch.tolist()
            t = torch.ones(1)
            dist.all_reduce(t)  # the ranks in step, as DDP keeps them
            time.sleep(0.02)
        epochs.append(seen)
    tuner = type(loader)._starvewatch_tuner
    out = {"rank": rank, "epochs": epochs, "twin_config": tuner.twin_config, "disabled": tuner.disabled,
           "applied": [(r["step"], r["config"]) for r in tuner.records if r["decision"] == "applied"],
           "board": tuner.board is not None}
    with open(os.path.join(os.environ["SW_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    starvewatch.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
