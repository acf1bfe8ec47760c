"""Framework integrations: Lightning and Hugging Face callbacks on tiny real models (CPU), the
accelerate one-liner, and that none of them costs anything when not used."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    code = ("import sys; from starvewatch.monitor.app import create_app; from starvewatch.monitor.settings "
            "import CollectorSettings; create_app(CollectorSettings()); print(sorted(m for m in ("
            "'opentelemetry.sdk', 'opentelemetry.exporter', 'tensorboard', 'lightning', 'transformers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("module, blocked, extra", [
    ("starvewatch.integrations.lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"), "lightning"),
    ("starvewatch.integrations.huggingface", ("transformers",), "hf"),
    ("starvewatch.monitor.otel", ("opentelemetry", "opentelemetry.sdk", "opentelemetry.sdk.metrics"), "otel"),
])
def test_a_missing_framework_says_how_to_install_it(monkeypatch, module, blocked, extra):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=rf"pip install 'starvewatch\[{extra}\]'"):
        importlib.import_module(module)
    monkeypatch.delitem(sys.modules, module, raising=False)


# ---- Lightning -----------------------------------------------------------------------------
def test_lightning_callback_watches_train_and_val_and_finishes_with_the_trainer(tmp_path):
    env = {**os.environ, "SW_NAME": "lightning-one"}
    done = subprocess.run([sys.executable, str(PROGRAMS / "lightning_train.py")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])["summary"]
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


def test_lightning_under_torchrun_watches_the_loaders_rebuilt_with_a_distributed_sampler(collector, tmp_path):
    """Rank 1's training_step takes 30 ms more: under DDP rank 0 waits for it in backward's
    all-reduce, and the callback's forward phase names rank 1 a compute straggler."""
    c = collector()
    env = {**os.environ, "STARVEWATCH_URL": c.url, "SW_NAME": "lightning-ddp", "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1", "SW_SLOW_FORWARD_RANK": "1"}
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
    assert found["compute_measured"]["train"] is True
    named = [(s["rank"], s["kind"], s["loader"]) for s in found["stragglers"]]
    assert named == [(1, "compute", "train")], found


# ---- Hugging Face ----------------------------------------------------------------------------
def test_transformers_trainer_callback_and_the_accelerate_one_liner(tmp_path):
    env = {**os.environ, "SW_EVAL": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
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
