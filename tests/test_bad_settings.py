"""Issue 24, item 6: never an exception into training. Every STARVEWATCH_* variable that the
README's configuration table documents (read from the README, so variables added later are
tried too) is given malformed values: the loop runs, finish() returns its summary, and the
variable gets at most one console line (exactly one where the value is malformed for it).
Unexpected shapes (a batch sampler that yields sets, objects without len, batches whose
leading dimension cannot be read) degrade the measurement, never the loop."""
import logging
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

import starvewatch
from starvewatch import envvars
from starvewatch.hooks.settings import HookSettings
from tests.conftest import shipped_column

README = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"  # the variable table
# Free text: any value is a valid one (a directory, a name, a token's characters are checked
# apart, below).
FREE_TEXT = {"STARVEWATCH_DIR", "STARVEWATCH_RUN_NAME", "STARVEWATCH_TOKEN"}
BAD_VALUES = ["500ms", "-1", "yes please \u2603"]
# Numbers, booleans and the URL: malformed for each of BAD_VALUES, so exactly one line each. A
# variable added to the table later is held to "never raises, at most one line" until it is
# listed here (a value may be malformed for it or not, and a kernel-only one is not read here).
TYPED = {"STARVEWATCH_URL", "STARVEWATCH_AUTOSTART", "STARVEWATCH_DISABLED", "STARVEWATCH_QUIET",
         "STARVEWATCH_STALL_MIN_S", "STARVEWATCH_STALL_FACTOR", "STARVEWATCH_HOST_INTERVAL_S",
         "STARVEWATCH_GPU_INTERVAL_S", "STARVEWATCH_WORKER_MEMORY_INTERVAL_S", "STARVEWATCH_SHIP_INTERVAL_S",
         "STARVEWATCH_GPU_EVENT_EVERY", "STARVEWATCH_SIDECAR", "STARVEWATCH_SHM_LIMIT_BYTES",
         "STARVEWATCH_TUNE"}


def documented_variables() -> list[str]:
    text = README.read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names = []
    for line in section.splitlines():
        if line.startswith("| `STARVEWATCH_"):
            first_cell = line.split("|")[1]
            names += re.findall(r"`(STARVEWATCH_[A-Z0-9_]+)", first_cell)
    return sorted(set(names))


def test_the_readme_table_is_read():
    names = documented_variables()
    assert {"STARVEWATCH_URL", "STARVEWATCH_STALL_FACTOR", "STARVEWATCH_SHM_LIMIT_BYTES"} <= set(names)
    assert TYPED | FREE_TEXT <= set(names), (TYPED | FREE_TEXT) - set(names)


@pytest.fixture
def said(caplog):
    envvars._said.clear()  # each test sees its own first line
    caplog.set_level(logging.WARNING, logger="starvewatch")
    return lambda name: [r.getMessage() for r in caplog.records if f"{name}=" in r.getMessage()]


class Numbers(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([float(i)])


@pytest.mark.parametrize("name", documented_variables())
def test_a_malformed_value_of_every_documented_variable_never_stops_training(name, said, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a relative STARVEWATCH_DIR lands here
    monkeypatch.setenv("STARVEWATCH_SIDECAR", "0")  # seconds each; STARVEWATCH_SIDECAR itself is tried too
    for value in BAD_VALUES:
        envvars._said.clear()
        monkeypatch.setenv(name, value)
        loader = starvewatch.watch(DataLoader(Numbers(), batch_size=4), name="train")
        assert [b.shape[0] for b in loader] == [4] * 6
        summary = starvewatch.finish()
        lines = said(name)
        said_now = [line for line in lines if repr(value[:80]) in line]
        if name == "STARVEWATCH_DISABLED" and summary is None:
            raise AssertionError(f"{name}={value!r} read as true")
        assert summary is not None and summary["loaders"][0]["steps"] == 6, (name, value)
        if name in FREE_TEXT:
            assert said_now == [], said_now
        elif name in TYPED:
            assert len(said_now) == 1, (name, value, lines)
        else:
            assert len(said_now) <= 1, (name, value, lines)
        monkeypatch.delenv(name)


def test_host_port_means_http_and_other_malformed_urls_mean_the_spool(said, monkeypatch):
    for raw, url in (("localhost:8412", "http://localhost:8412"), ("127.0.0.1:9/", "http://127.0.0.1:9"),
                     ("[::1]:8412", "http://[::1]:8412"), ("http://h:1/", "http://h:1"),
                     ("https://collector.example:443/sw", "https://collector.example:443/sw")):
        monkeypatch.setenv("STARVEWATCH_URL", raw)
        assert HookSettings.from_env().url == url, raw
    assert len(said("STARVEWATCH_URL")) == 3  # the ones written without a scheme (and no more)
    for raw in ("ftp://host:1", "http://", "http://host:port", "localhost", "500ms", "http//host:1"):
        monkeypatch.setenv("STARVEWATCH_URL", raw)
        settings = HookSettings.from_env()
        assert settings.url is None, raw  # the spool, and nothing to auto-start
    monkeypatch.setenv("STARVEWATCH_URL", "off")
    assert HookSettings.from_env().url is None and said("STARVEWATCH_URL=off") == []


def test_a_malformed_url_keeps_records_in_the_spool_and_starts_no_collector(monkeypatch, isolated_starvewatch):
    monkeypatch.setenv("STARVEWATCH_URL", "collector.internal/8412")
    monkeypatch.setenv("STARVEWATCH_AUTOSTART", "1")
    loader = starvewatch.watch(DataLoader(Numbers(), batch_size=4), name="train")
    assert sum(1 for _ in loader) == 6
    summary = starvewatch.finish()
    assert summary["delivery"]["spooled"] == 6, summary["delivery"]
    assert not (isolated_starvewatch / "collector.pid").exists()
    assert not (isolated_starvewatch / "collector.lock").exists()  # never tried to start one


def test_booleans_and_numbers(monkeypatch, said):
    for word, expected in (("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False),
                           ("false", False), ("No", False), ("off", False), ("maybe", None), ("2", None)):
        monkeypatch.setenv("STARVEWATCH_QUIET", word)
        got = HookSettings.from_env().quiet
        assert got == (False if expected is None else expected), word  # unknown: the default
    assert len(said("STARVEWATCH_QUIET")) == 2
    for raw in ("500ms", "nan", "inf", "0", "-2", ""):
        monkeypatch.setenv("STARVEWATCH_HOST_INTERVAL_S", raw)
        assert HookSettings.from_env().host_interval_s == 0.5, raw
    monkeypatch.setenv("STARVEWATCH_HOST_INTERVAL_S", "0.25")
    assert HookSettings.from_env().host_interval_s == 0.25
    monkeypatch.setenv("STARVEWATCH_GPU_EVENT_EVERY", "2.5")
    assert HookSettings.from_env().gpu_event_every == 4


def test_watch_none_is_still_a_usage_error():
    with pytest.raises(TypeError):
        starvewatch.watch(None)


class SetBatches(Sampler):
    """Yields each batch's indices as a set: plain torch takes it (a set can be iterated)."""

    def __init__(self):
        super().__init__()

    def __iter__(self):
        for start in range(0, 24, 4):
            yield set(range(start, start + 4))

    def __len__(self):
        return 6


@pytest.mark.parametrize("sampler", [SetBatches])
def test_a_batch_sampler_yielding_sets_works_with_workers(sampler, memory_run):
    plain = sorted(float(x) for b in DataLoader(Numbers(), batch_sampler=sampler(), num_workers=2,
                                                 multiprocessing_context="fork") for x in b.flatten())
    loader = starvewatch.watch(DataLoader(Numbers(), batch_sampler=sampler(), num_workers=2,
                                          multiprocessing_context="fork"), name="sets")
    watched = sorted(float(x) for b in loader for x in b.flatten())
    assert watched == plain == [float(i) for i in range(24)]
    _, transport = memory_run
    starvewatch.finish()
    assert len(shipped_column(transport, "wait_ns", "sets")) == 6


class NoLen:
    def __iter__(self):
        return iter(range(5))


class OddShape:
    """A batch whose shape cannot be read: its leading dimension is unknown."""

    shape = (None, 3)


class RaisingShape:
    @property
    def shape(self):
        raise RuntimeError("lazy tensor: not materialised")


def test_objects_without_len_and_unreadable_batches_degrade_the_measurement(memory_run):
    assert list(starvewatch.watch(NoLen(), name="nolen")) == [0, 1, 2, 3, 4]
    batches = [OddShape(), OddShape()]
    assert list(starvewatch.watch(batches, name="odd")) == batches
    raising = [RaisingShape(), [RaisingShape()], {"x": RaisingShape()}]
    assert list(starvewatch.watch(raising, name="raising")) == raising
    _, transport = memory_run
    starvewatch.finish()
    assert len(shipped_column(transport, "wait_ns", "nolen")) == 5
    assert shipped_column(transport, "batch_size", "odd") == [None, None]
    assert len(shipped_column(transport, "wait_ns", "raising")) == 3
