"""What the training process takes from its environment stays in its place, and the errors its
monitor survives are said once on the console (the sidecar's included)."""
import logging
import time

import pytest

import starvewatch
from starvewatch.ids import id_problem
from starvewatch.monitor.storage.spool_import import SpoolImporter
from starvewatch.monitor.storage.store import Store


def test_a_hostile_run_id_from_the_environment_stays_inside_the_spool(isolated_starvewatch, monkeypatch, caplog):
    monkeypatch.setenv("STARVEWATCH_RUN_ID", "../../escape")
    monkeypatch.setenv("STARVEWATCH_RUN_NAME", "name\nwith\x1bcontrols")
    with caplog.at_level(logging.WARNING, logger="starvewatch"):
        list(starvewatch.watch(range(25), name="load\ter"))
        summary = starvewatch.finish()
    run_id = summary["run"]["id"]
    assert run_id != "../../escape" and id_problem(run_id) is None
    assert summary["run"]["name"] == "name with controls"
    spool = (isolated_starvewatch / "spool").resolve()
    files = sorted(spool.glob("*/*/*.json.gz"))
    assert files and {f.parent.parent.name for f in files} == {run_id}
    assert not (isolated_starvewatch.parent.parent / "escape").exists()
    lines = [r.getMessage() for r in caplog.records if "STARVEWATCH_RUN_ID" in r.getMessage()]
    assert len(lines) == 1 and run_id in lines[0], lines
    # The collector accepts every batch the hooks made from these names.
    store = Store(isolated_starvewatch / "check.db")
    importer = SpoolImporter(store, spool, delete=False)
    assert importer.scan() == len(files) and importer.rejected_files == []
    assert [r["name"] for r in store.loader_rows(run_id)] == ["load er"]
    store.close()


@pytest.mark.parametrize("sidecar", ["1", "0"])
def test_a_spool_that_cannot_be_written_is_said_once_on_the_console(isolated_starvewatch, monkeypatch, capfd,
                                                                    sidecar):
    monkeypatch.setenv("STARVEWATCH_SIDECAR", sidecar)
    monkeypatch.setenv("STARVEWATCH_RUN_ID", "blocked-run")
    monkeypatch.setenv("STARVEWATCH_SHIP_INTERVAL_S", "0.05")
    monkeypatch.setenv("STARVEWATCH_QUIET", "0")
    blocker = isolated_starvewatch / "spool" / "blocked-run"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the run's spool directory would go")
    for _ in starvewatch.watch(range(200)):
        time.sleep(0.003)  # a training step: 0.6 s of training, about a dozen shipping cycles
    summary = starvewatch.finish(quiet=True)
    # Through the sidecar (its stderr is the training console) or in-process: one line, and
    # every record counted as dropped for that reason.
    said = [line for line in capfd.readouterr().err.splitlines() if line.startswith("starvewatch:")]
    assert len(said) == 1 and "cannot write the spool" in said[0] and "Not a directory" in said[0], said
    assert summary["delivery"]["dropped"] == {"spool_error": 200}, summary["delivery"]
