"""Framework integrations: Lightning and Hugging Face callbacks on tiny real models (CPU), the
accelerate one-liner, and that none of them costs anything when not used."""
import csv
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from time import perf_counter_ns

import pytest

import starvewatch

from .conftest import free_port, wait_until

PROGRAMS = Path(__file__).parent / "programs"


def _loaders(summary):
    return {l["name"]: l for l in summary["loaders"]}


def test_importing_starvewatch_imports_no_framework():
    code = ("import sys, starvewatch, starvewatch.integrations; "
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate', "
            "'opentelemetry', 'tensorboard', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    # Nor does a collector that was not asked for OTLP or TensorBoard (FastAPI itself may load
    # the OpenTelemetry *API* when installed; the SDK and exporters are ours to load).
    code = ("import sys; from starvewatch.monitor.web.app import create_app; from starvewatch.monitor.web.collector_settings "
            "import CollectorSettings; create_app(CollectorSettings()); print(sorted(m for m in ("
            "'opentelemetry.sdk', 'opentelemetry.exporter', 'tensorboard', 'lightning', 'transformers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("module, blocked, extra", [
    ("starvewatch.integrations.lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"), "lightning"),
    ("starvewatch.integrations.huggingface", ("transformers",), "hf"),
    ("starvewatch.monitor.outputs.otel", ("opentelemetry", "opentelemetry.sdk", "opentelemetry.sdk.metrics"), "otel"),
])
def test_a_missing_framework_says_how_to_install_it(monkeypatch, module, blocked, extra):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'starvewatch\[{extra}\]'"):
        importlib.import_module(module)
    monkeypatch.delitem(sys.modules, module, raising=False)


# ---- the figures the integrations log: this process's run, read while it runs ----------------
class _SlowItems:
    """A map-style dataset whose items take 2 ms each to load (torch-free until used)."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        import torch
        time.sleep(0.002)
        return torch.tensor([float(i)])


def test_live_figures_are_the_loops_own_measure_while_it_runs():
    from torch.utils.data import DataLoader
    from starvewatch.hooks.live import live_figures
    assert live_figures() is None  # no run in this process yet
    loader = starvewatch.watch(DataLoader(_SlowItems(), batch_size=2), "train")
    wait_ns = compute_ns = 0
    t = perf_counter_ns()
    it = iter(loader)
    while True:  # the loop times itself: time in next() (with the StopIteration) against the rest
        try:
            next(it)
        except StopIteration:
            wait_ns += perf_counter_ns() - t
            break
        t1 = perf_counter_ns()
        wait_ns += t1 - t
        time.sleep(0.003)
        t = perf_counter_ns()
        compute_ns += t - t1
    truth = wait_ns / (wait_ns + compute_ns)
    # The figures follow the records as they are processed (within a shipping interval).
    figures = wait_until(lambda: (f := live_figures()) and f["loaders"]["train"]["steps"] == 20 and f,
                         what="the 20 steps in the live figures")
    train = figures["loaders"]["train"]
    assert train["input_wait_fraction"] == pytest.approx(truth, abs=0.02)
    assert figures["input_wait_fraction"] == pytest.approx(truth, abs=0.02)
    assert train["batches_per_s"] == pytest.approx(20 / ((wait_ns + compute_ns) / 1e9), rel=0.05)
    assert figures["verdict"] == train["verdict"] == "high"  # ~40% of the loop waits (>= 20%)
    summary = starvewatch.finish()
    assert live_figures() is None  # the run ended
    final = _loaders(summary)["train"]
    assert train["input_wait_fraction"] == pytest.approx(final["input_wait_fraction"], rel=1e-9)
    assert train["batches_per_s"] == pytest.approx(final["batches_per_s"], rel=1e-9)


# ---- Lightning -----------------------------------------------------------------------------
def _csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def test_lightning_callback_watches_train_and_val_and_finishes_with_the_trainer(tmp_path):
    """Also: the figures reach the trainer's loggers (Lightning's CSVLogger, read back from the
    file it wrote) every 4 training batches, and the final ones and the verdict at the end; a
    logger that refuses them before the CSVLogger costs one warning, not the CSV's rows."""
    # The live figures follow the records processed so far. With the sidecar (the default, tried
    # by test_live_figures_...) that is once the sidecar has started, which takes seconds on a
    # loaded machine, longer than this run: here the records are processed in this process.
    env = {**os.environ, "SW_NAME": "lightning-one", "SW_CSV_DIR": str(tmp_path / "logs"), "SW_LOG_EVERY": "4",
           "STARVEWATCH_SHIP_INTERVAL_S": "0.05", "STARVEWATCH_SIDECAR": "0"}
    done = subprocess.run([sys.executable, str(PROGRAMS / "lightning_train.py")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])["summary"]
    rows = [row for row in _csv_rows(tmp_path / "logs" / "csv" / "version_0" / "metrics.csv")
            if "starvewatch/verdict_level" in row]
    # 32 training batches, one log every 4 (steps 4, 8 ... 32), then the final figures.
    assert [int(row["step"]) for row in rows] == [4, 8, 12, 16, 20, 24, 28, 32, 32]
    final, live = rows[-1], [row for row in rows[:-1] if "starvewatch/train/input_wait_fraction" in row]
    assert float(final["starvewatch/input_wait_fraction"]) == pytest.approx(summary["verdict"]["input_wait_fraction"])
    loaders = _loaders(summary)
    for name in ("train", "val"):
        assert float(final[f"starvewatch/{name}/input_wait_fraction"]) == pytest.approx(loaders[name]["input_wait_fraction"])
        assert float(final[f"starvewatch/{name}/batches_per_s"]) == pytest.approx(loaders[name]["batches_per_s"])
    bands = ("insufficient_data", "not", "moderate", "high")
    assert float(final["starvewatch/verdict_level"]) == bands.index(summary["verdict"]["input_bound"])
    # The live figures are the run's own, read while it ran: most logs had records to show,
    # and the last one agrees with the final figure (the same steady loader).
    assert len(live) >= 4, rows
    assert float(live[-1]["starvewatch/train/input_wait_fraction"]) == pytest.approx(
        loaders["train"]["input_wait_fraction"], abs=0.1)
    assert [float(row["starvewatch/train/batches_per_s"]) > 0 for row in live] == [True] * len(live)
    refused = [line for line in done.stderr.splitlines() if "logging the figures through Rejecting failed" in line]
    assert len(refused) == 1 and "metric names with '/' are not accepted here" in refused[0], done.stderr[-2000:]
    hparams = (tmp_path / "logs" / "csv" / "version_0" / "hparams.yaml").read_text()
    assert f"starvewatch/verdict: {summary['verdict']['input_bound']}" in hparams
    top = summary["recommendations"][0] if summary["recommendations"] else None
    assert "starvewatch/recommendation: " + (f"'{top['loader']}: " if top else "none") in hparams
    assert summary["run"]["name"] == "lightning-one" and summary["run"]["status"] == "finished"
    loaders = _loaders(summary)
    assert sorted(loaders) == ["train", "val"]
    # 64 samples / batch 4 = 16 steps per epoch, 2 epochs; validation 16 / 4 = 4 per epoch.
    assert (loaders["train"]["steps"], loaders["train"]["epochs"]) == (32, 2)
    assert (loaders["val"]["steps"], loaders["val"]["epochs"]) == (8, 2)
    # Each loader waited ~2 ms per sample x 4 per batch: the wait is measured, not lost.
    assert loaders["train"]["wait_ms"]["p50"] >= 7.0
    # Steps are marked from on_train_batch_start to on_train_batch_end: Lightning's own time
    # between batches is reported apart, as other_ms (an unmarked loop has none).
    assert loaders["train"]["other_ms_total"] > 0
    assert loaders["val"]["other_ms_total"] == 0


def test_lightning_callback_with_log_figures_off_logs_nothing_of_its_own(tmp_path):
    env = {**os.environ, "SW_NAME": "lightning-quiet", "SW_CSV_DIR": str(tmp_path / "logs"), "SW_LOG_EVERY": "2",
           "SW_LOG_FIGURES": "0", "STARVEWATCH_SHIP_INTERVAL_S": "0.05"}
    done = subprocess.run([sys.executable, str(PROGRAMS / "lightning_train.py")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _loaders(json.loads(done.stdout.strip().splitlines()[-1])["summary"])["train"]["steps"] == 32
    written = tmp_path / "logs" / "csv" / "version_0"
    rows = _csv_rows(written / "metrics.csv")
    assert [row["step"] for row in rows if "val_loss" in row] == ["15", "31"]  # Lightning's own, per epoch
    assert not [key for row in rows for key in row if key.startswith("starvewatch/")], rows
    assert not (written / "hparams.yaml").exists()  # nothing logged as hyperparameters: no verdict, no text


def test_lightning_callback_tunes_the_training_loader_at_epoch_boundaries(tmp_path):
    """tune=True (issue 39): the training loader's epochs after the first (whose iterator
    Lightning made before the callback ran) are tuned; every sample still comes once."""
    env = {**os.environ, "SW_NAME": "lightning-tuned", "SW_TUNE": "1", "SW_EPOCHS": "4", "SW_LOAD_S": "0.004",
           "STARVEWATCH_SIDECAR": "0"}
    done = subprocess.run([sys.executable, str(PROGRAMS / "lightning_train.py")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])["summary"]
    assert _loaders(summary)["train"]["steps"] == 64  # 4 epochs of 16 batches: none lost, none doubled
    tuned = summary["live_tuning"]["loaders"]
    assert [t["loader"] for t in tuned] == ["train"] and tuned[0]["start"]["num_workers"] == 0
    configs = [r["config"]["num_workers"] for r in summary["live_tuning"]["records"]]
    # measured, then more workers tried (2, or what the run's advice said, within the bounds)
    assert configs[0] == 0 and len(configs) >= 2 and configs[1] > 0, summary["live_tuning"]["records"]


def test_lightning_under_torchrun_watches_the_loaders_rebuilt_with_a_distributed_sampler(collector, tmp_path):
    """Rank 1's training_step takes 30 ms more: under DDP rank 0 waits for it in backward's
    all-reduce, and the callback's forward phase names rank 1 a compute straggler."""
    c = collector()
    env = {**os.environ, "STARVEWATCH_URL": c.url, "SW_NAME": "lightning-ddp", "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1", "SW_SLOW_FORWARD_RANK": "1",
           "SW_LOAD_S": "0"}  # no sleeps to load: on a loaded machine they overrun unevenly across ranks
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(PROGRAMS / "lightning_train.py")]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run = wait_until(lambda: [r for r in c.get("/api/v1/runs")["runs"]
                              if r["name"] == "lightning-ddp" and r["status"] == "finished"], what="the run")
    assert len(run) == 1 and run[0]["ranks"] == 2
    for rank in (0, 1):
        loaders = _loaders(c.get(f"/api/v1/runs/{run[0]['id']}/summary?rank={rank}"))
        # Each rank sees half of the data: 32 samples / 4 = 8 steps per epoch, 2 epochs.
        assert loaders["train"]["steps"] == 16, loaders["train"]
        assert loaders["train"]["config"]["sampler"] == "DistributedSampler"
        assert loaders["val"]["config"]["sampler"] == "DistributedSampler"
    found = c.get(f"/api/v1/runs/{run[0]['id']}/stragglers")
    # Validation's windows (2 steps a rank per epoch, a few ms each) are too short to judge a rank
    # by: one preemption there is 10% of its step. Train's forward phase measures its compute.
    assert found["compute_measured"] == {"train": True}
    # Only the slowness the program put in is named. With 4 x 2 ms sleeps to load a batch, a
    # loaded machine overran them unevenly: rank 0 named an input straggler on train, rank 1 on
    # validation (10.1% of a 127 ms step), true of those runs but not what this program controls.
    named = [(s["rank"], s["kind"], s["loader"]) for s in found["stragglers"]]
    assert named == [(1, "compute", "train")], found


# ---- Hugging Face ----------------------------------------------------------------------------
def test_transformers_trainer_callback_and_the_accelerate_one_liner(tmp_path):
    """Also: watch_trainer puts the figures in the Trainer's logs (the Trainer logs every 4 steps;
    the figures ride along at most every 8, under the prefix asked for), into state.log_history and
    to the callbacks that stand where report_to's stand; with log_figures=False, nothing."""
    env = {**os.environ, "SW_EVAL": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "SW_LOG_STEPS": "4",
           "SW_LOG_EVERY": "8", "SW_LOG_PREFIX": "sw.", "STARVEWATCH_SHIP_INTERVAL_S": "0.05",
           "STARVEWATCH_SIDECAR": "0"}  # the live figures without the sidecar's start-up (see the Lightning test)
    done = subprocess.run([sys.executable, str(PROGRAMS / "hf_train.py"), str(tmp_path / "out")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    trainer = result["trainer"]
    assert trainer["run"]["name"] == "hf-tiny" and trainer["run"]["status"] == "finished"
    loaders = _loaders(trainer)
    # 48 samples / batch 4 = 12 steps per epoch, 2 epochs; evaluation 16 / 4 = 4 per epoch.
    assert (loaders["train"]["steps"], loaders["train"]["epochs"]) == (24, 2)
    assert (loaders["val"]["steps"], loaders["val"]["epochs"]) == (8, 2)
    assert loaders["train"]["wait_ms"]["p50"] >= 7.0  # ~2 ms per sample, 4 per batch
    assert loaders["train"]["other_ms_total"] > 0  # steps marked from on_step_begin to on_step_end
    # accelerate: the loader prepare() returned is still accelerate's, and it was watched.
    assert result["loader_type"] == "DataLoaderShard"
    acc = _loaders(result["accelerate"])
    assert result["accelerate"]["run"]["name"] == "accelerate-tiny"
    assert (acc["train"]["steps"], acc["train"]["epochs"]) == (12, 1)

    # The Trainer logged at steps 4, 8 ... 24, after each evaluation (at 12 and 24), and at the
    # end; the figures came with the first log, then with the first log 8 steps or more after
    # the last one that had them, and with the final log.
    history, reported = result["log_history"], result["reported"]
    assert [entry["step"] for entry in history] == [4, 8, 12, 12, 16, 20, 24, 24, 24], history
    assert ["sw.verdict_level" in entry for entry in history] == [True, False, True, False, False, True,
                                                                    False, False, True], history
    assert not [key for entry in history for key in entry if key.startswith("starvewatch/")]
    # The reporting callbacks were given the same figures as log_history holds.
    ours = lambda entry: {k: v for k, v in entry.items() if k.startswith("sw.")}  # noqa: E731
    assert [ours(entry) for entry in reported] == [ours(entry) for entry in history]
    final = history[-1]
    assert "train_runtime" in final
    assert final["sw.input_wait_fraction"] == pytest.approx(trainer["verdict"]["input_wait_fraction"])
    for name in ("train", "val"):
        assert final[f"sw.{name}/input_wait_fraction"] == pytest.approx(loaders[name]["input_wait_fraction"])
        assert final[f"sw.{name}/batches_per_s"] == pytest.approx(loaders[name]["batches_per_s"])
    assert final["sw.verdict"] == trainer["verdict"]["input_bound"]
    top = trainer["recommendations"][0] if trainer["recommendations"] else None
    assert final["sw.recommendation"].startswith(f"{top['loader']}: " if top else "none")
    # The live figures at step 20 are the run's own, read while it ran.
    assert history[5]["sw.train/input_wait_fraction"] == pytest.approx(loaders["train"]["input_wait_fraction"], abs=0.1)
    assert result["log_left_alone"] is True
