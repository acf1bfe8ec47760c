"""A tiny BERT classifier built from a config (nothing downloaded: HF_HUB_OFFLINE=1) trained by
`transformers.Trainer` on CPU with the starvewatch callback; then the accelerate one-liner.
Prints {"trainer": summary, "accelerate": summary} as JSON on its last line."""
import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"

import torch
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

import starvewatch
from starvewatch.integrations.huggingface import StarvewatchCallback, watch_trainer

SEQ, TRAIN, EVAL, BATCH = 16, 48, 16, 4


class Tokens(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.002)
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (SEQ,), generator=g),
                "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": torch.tensor(i % 2)}


config = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=SEQ)
torch.manual_seed(0)
model = BertForSequenceClassification(config)
# SW_LOG_STEPS: the Trainer logs every that many steps (starvewatch's figures ride along).
log_steps = int(os.environ.get("SW_LOG_STEPS", "0"))
args = TrainingArguments(output_dir=sys.argv[1], num_train_epochs=2, per_device_train_batch_size=BATCH,
                         per_device_eval_batch_size=BATCH, eval_strategy="epoch", save_strategy="no",
                         logging_strategy="steps" if log_steps else "no", logging_steps=log_steps or 500,
                         report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(TRAIN), eval_dataset=Tokens(EVAL))


class Reporter(TrainerCallback):
    """Stands where report_to's callbacks stand (added before ours): what it is given is what
    W&B, MLflow or TensorBoard would be given."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


reporter = Reporter()
trainer.add_callback(reporter)
if os.environ.get("SW_EVAL") == "1":
    every = os.environ.get("SW_LOG_EVERY")
    callback = watch_trainer(trainer, "hf-tiny", log_prefix=os.environ.get("SW_LOG_PREFIX", "starvewatch/"),
                             log_every_n_steps=int(every) if every else None)
else:
    callback = StarvewatchCallback("hf-tiny")
    trainer.add_callback(callback)
trainer.train()

# With log_figures=False, watch_trainer leaves the Trainer's log as it is.
quiet_trainer = Trainer(model=model, args=args, train_dataset=Tokens(TRAIN), eval_dataset=Tokens(EVAL))
watch_trainer(quiet_trainer, "hf-quiet", log_figures=False)
log_left_alone = quiet_trainer.log.__func__ is Trainer.log

# accelerate: one added line around the loader `prepare` returns.
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
model2 = torch.nn.Linear(SEQ, 2)
optimizer = torch.optim.SGD(model2.parameters(), lr=0.1)
loader = DataLoader(Tokens(TRAIN), batch_size=BATCH)
starvewatch.init("accelerate-tiny")
model2, optimizer = accelerator.prepare(model2, optimizer)
loader = starvewatch.watch(accelerator.prepare(loader))  # the one line
for batch in loader:
    loss = torch.nn.functional.cross_entropy(model2(batch["input_ids"].float()), batch["labels"])
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
print(json.dumps({"trainer": callback.summary, "accelerate": starvewatch.finish(),
                  "loader_type": type(loader).__name__, "log_history": trainer.state.log_history,
                  "reported": reporter.logs, "log_left_alone": log_left_alone}), flush=True)
