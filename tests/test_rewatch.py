"""A new loader watched under a name already used: other settings start a new run of the same
name, the same settings go on in the run (in a script as in a notebook); and the parts of the
notebook support that need no kernel."""
import logging
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import starvewatch
from starvewatch.hooks import notebook, session as sw_session
from starvewatch.hooks.settings import HookSettings
from tests.conftest import shipped_steps


def _epoch(loader) -> int:
    return sum(1 for _ in loader)


DS = TensorDataset(torch.arange(32.0))


def test_other_settings_start_a_new_run_of_the_same_name(memory_run):
    first, transport = memory_run
    assert _epoch(starvewatch.watch(DataLoader(DS, batch_size=8), "train")) == 4
    second_loader = starvewatch.watch(DataLoader(DS, batch_size=16), "train")
    second = sw_session.current_session()
    assert second is not first and not first.active
    assert second.name == first.name == "test-run" and second.run_id != first.run_id
    assert _epoch(second_loader) == 2
    summary = starvewatch.finish()
    assert [(l["name"], l["config"]["batch_size"], l["steps"]) for l in summary["loaders"]] == [("train", 16, 2)]
    # The first run kept its own loader, settings and steps; both went to the same transport.
    runs = {p["run"]["id"]: p for p in transport.payloads}
    assert set(runs) == {first.run_id, second.run_id}
    assert first.loaders["train"].config["batch_size"] == 8
    assert sum(len(p["steps"]["step"]) for p in transport.payloads if p["run"]["id"] == first.run_id) == 4


def test_the_same_settings_go_on_in_the_run(memory_run):
    session, transport = memory_run
    _epoch(starvewatch.watch(DataLoader(DS, batch_size=8), "train"))
    rebuilt = starvewatch.watch(DataLoader(DS, batch_size=8, shuffle=True), "train")  # another sampler
    assert sw_session.current_session() is session
    _epoch(rebuilt)
    summary = starvewatch.finish()
    assert [(l["name"], l["steps"], l["epochs"]) for l in summary["loaders"]] == [("train", 8, 2)]
    assert len(shipped_steps(transport)) == 8


def test_settings_changed_before_the_first_epoch_stay_in_the_run(memory_run):
    session, _ = memory_run
    starvewatch.watch(DataLoader(DS, batch_size=8), "train")  # the cell is re-run before training
    loader = starvewatch.watch(DataLoader(DS, batch_size=4), "train")
    assert sw_session.current_session() is session
    _epoch(loader)
    summary = starvewatch.finish()
    assert [(l["config"]["batch_size"], l["steps"]) for l in summary["loaders"]] == [(4, 8)]


def test_a_distributed_job_derives_the_next_run_id_on_every_rank(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    _epoch(starvewatch.watch(DataLoader(DS, batch_size=8), "train"))
    first = sw_session.current_session().run_id
    _epoch(starvewatch.watch(DataLoader(DS, batch_size=16), "train"))
    second = sw_session.current_session().run_id
    _epoch(starvewatch.watch(DataLoader(DS, batch_size=8), "train"))
    third = sw_session.current_session().run_id
    # The job's id is the same on every rank: the next runs are numbered from it, not random.
    assert (second, third) == (f"{first}-r2", f"{first}-r3")


def test_a_run_the_user_finishes_is_not_resumed_by_name(memory_run):
    _epoch(starvewatch.watch(DataLoader(DS, batch_size=8), "train"))
    starvewatch.watch(DataLoader(DS, batch_size=16), "train")  # a new run "test-run"
    starvewatch.finish()
    starvewatch.watch([1, 2], "x")
    assert sw_session.current_session().name != "test-run"  # the default name, as after any finish()


@pytest.mark.parametrize("raw, expected, complains", [
    (None, 600.0, False), ("30", 30.0, False), ("0.5", 0.5, False), ("off", 0.0, False),
    ("0", 0.0, False), ("ten", 600.0, True), ("-5", 600.0, True), ("nan", 600.0, True), ("inf", 600.0, True)])
def test_notebook_idle_setting(monkeypatch, caplog, raw, expected, complains):
    """Read as every number setting (envvars.number): a malformed value gets its one warning."""
    caplog.set_level(logging.WARNING, logger="starvewatch")
    if raw is None:
        monkeypatch.delenv("STARVEWATCH_NOTEBOOK_IDLE_S", raising=False)
    else:
        monkeypatch.setenv("STARVEWATCH_NOTEBOOK_IDLE_S", raw)
    assert HookSettings.from_env().notebook_idle_s == expected
    assert any("STARVEWATCH_NOTEBOOK_IDLE_S" in r.getMessage() for r in caplog.records) is complains


def test_outside_a_kernel_nothing_changes(memory_run):
    assert notebook.kernel_shell() is None
    _epoch(starvewatch.watch([1, 2, 3]))
    summary = starvewatch.finish()
    assert type(summary) is dict  # a plain dict, as always, outside a kernel


def test_summary_html_escapes_what_users_name():
    html = notebook.summary_html({
        "run": {"name": "<script>alert(1)</script>", "id": "r1", "status": "finished"},
        "verdict": {"input_bound": "high", "input_wait_fraction": 0.83},
        "loaders": [{"name": "<b>x</b>", "steps": 3, "input_wait_fraction": 0.83, "verdict": "high",
                     "batches_per_s": 2.0}],
        "recommendations": [{"loader": "x", "parameter": "num_workers", "suggested": 4, "current": 0,
                             "reason": "a < b"}]})
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>x</b>" not in html
    assert "83.0%" in html and "num_workers=4 (now 0)" in html


@pytest.mark.parametrize("url, template, expected", [
    ("http://127.0.0.1:8412", None, "http://127.0.0.1:8412/runs/r-1"),
    ("http://user:secret@127.0.0.1:9000/", None, "http://127.0.0.1:9000/runs/r-1"),
    ("http://127.0.0.1:9000", "/user/a/proxy/%PORT%/", "/user/a/proxy/9000/runs/r-1"),
    ("http://127.0.0.1:9000", "https://hub.example/user/a/proxy/%PORT%", "https://hub.example/user/a/proxy/9000/runs/r-1"),
    ("off", None, None)])
def test_run_page_url(monkeypatch, url, template, expected):
    if template is None:
        monkeypatch.delenv("STARVEWATCH_PROXY_URL", raising=False)
    else:
        monkeypatch.setenv("STARVEWATCH_PROXY_URL", template)
    settings = HookSettings.from_env(url=url)
    assert notebook.run_page_url(settings, "r-1") == expected


def test_a_script_never_imports_the_notebook_module(tmp_path):
    code = ("import sys, starvewatch; list(starvewatch.watch([1, 2, 3])); starvewatch.finish(); "
            "print('starvewatch.hooks.notebook' in sys.modules, 'IPython' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path, timeout=120)  # the environment of the fixture: spool only
    assert out.stdout.split()[-2:] == ["False", "False"]


@pytest.mark.parametrize("with_gpu", [False, True])
def test_settled_steps_end_at_the_cell_end_on_every_path(monkeypatch, memory_run, with_gpu):
    """What the notebook's post_run_cell does, on the fast path, the general one and the fast
    path of a CUDA run (sampled events): the open step ends at the given time, the time after
    it (the user between cells) is no step's compute, and the loop goes on unchanged."""
    import threading
    import time
    from time import perf_counter_ns

    from starvewatch.hooks import cuda
    from tests.conftest import shipped_column
    from tests.test_measurement import FakeGpu
    session, transport = memory_run
    if with_gpu:
        session.settings.gpu_event_every = 1000  # after the first step, gaps of up to 1999 steps
        monkeypatch.setattr(cuda, "detect_event_factory", lambda: FakeGpu().event)
    iterator = iter(starvewatch.watch(list(range(40)), "nb"))
    got, idle_s, settled_on = [], 0.3, set()
    for i, batch in enumerate(iterator):
        got.append(batch)
        fast = type(iterator).__name__ == ("FastGpuWatchedIterator" if with_gpu else "FastWatchedIterator")
        # The cell ends here (once on the fast path, once wherever step 20 is); the next one
        # starts after `idle_s`.
        if (i >= 5 and fast and not settled_on) or i == 20:
            settled_on.add(type(iterator).__name__)
            session.settle_open_steps(threading.get_ident(), perf_counter_ns())
            time.sleep(idle_s)  # the user reading (the scenario, not a synchronisation)
    assert got == list(range(40))
    assert ("FastGpuWatchedIterator" if with_gpu else "FastWatchedIterator") in settled_on
    summary = starvewatch.finish()
    assert summary["loaders"][0]["steps"] == 40
    computes = shipped_column(transport, "compute_ns", "nb")
    assert len(computes) == 40 and max(computes) < idle_s * 1e9 / 3, max(computes)
    waits = shipped_column(transport, "wait_ns", "nb")
    assert max(waits) < idle_s * 1e9 / 3  # nor wait: the next step starts at the next next()
