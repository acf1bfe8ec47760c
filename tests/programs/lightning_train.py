"""A tiny Lightning model on CPU with StarvewatchCallback. Run directly (one process) or under
`torchrun --nproc-per-node 2` (DDP, gloo: Lightning rebuilds the loaders with a DistributedSampler).
Prints the summary as JSON on the last line of rank 0's stdout."""
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

import lightning.pytorch as pl

from starvewatch.integrations.lightning import StarvewatchCallback

TRAIN, VAL, BATCH = 64, 16, 4
EPOCHS = int(os.environ.get("SW_EPOCHS", "2"))
SLEEP_S = float(os.environ.get("SW_LOAD_S", "0.002"))
SLOW_FORWARD_RANK = int(os.environ.get("SW_SLOW_FORWARD_RANK", "-1"))  # this rank's forward takes 30 ms more


class Synthetic(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if SLEEP_S:  # (a sleep of 0 would still yield the CPU)
            time.sleep(SLEEP_S)
        return torch.full((8,), i / self.n), torch.tensor([float(i % 2)])


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.global_rank == SLOW_FORWARD_RANK:
            time.sleep(0.03)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(Synthetic(TRAIN), batch_size=BATCH, num_workers=0)

    def val_dataloader(self):
        return DataLoader(Synthetic(VAL), batch_size=BATCH, num_workers=0)


class Rejecting(pl.loggers.Logger):
    """A logger that refuses starvewatch's metrics (as a tracking service might refuse a name):
    the other loggers and the training go on."""

    name, version = "rejecting", 0

    def log_metrics(self, metrics, step=None):
        if any(key.startswith("starvewatch/") for key in metrics):
            raise ValueError("metric names with '/' are not accepted here")

    def log_hyperparams(self, params, *args, **kwargs):
        pass


if __name__ == "__main__":
    torch.manual_seed(0)
    distributed = "LOCAL_RANK" in os.environ
    # SW_CSV_DIR: log through Lightning's CSVLogger there, every SW_LOG_EVERY training batches.
    csv_dir = os.environ.get("SW_CSV_DIR")
    logger = [Rejecting(), pl.loggers.CSVLogger(csv_dir, name="csv", version=0)] if csv_dir else False
    log_every = int(os.environ.get("SW_LOG_EVERY", "50"))
    callback = StarvewatchCallback(name=os.environ.get("SW_NAME", "lightning-tiny"),
                                   log_figures=os.environ.get("SW_LOG_FIGURES", "1") == "1",
                                   tune=os.environ.get("SW_TUNE") == "1" or None)
    trainer = pl.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=2 if distributed else 1,
                         strategy="ddp" if distributed else "auto", callbacks=[callback],
                         num_sanity_val_steps=0, logger=logger, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=log_every)
    trainer.fit(Tiny())
    print(json.dumps({"rank": trainer.global_rank, "summary": callback.summary}), flush=True)
