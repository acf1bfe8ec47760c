"""A long-lived collector's spool sweep keeps no growing list of the files it rejected: the
run's account in the database counts and lists them (`unreadable_spool`), the importer only how
many and the latest few paths; files it could not set aside are forgotten once gone."""
from starvewatch.monitor.storage import spool_import
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.spool_import import SpoolImporter
from starvewatch.monitor.storage.store import Store
from tests.test_spool_files import truncated_gzip, write

ROUNDS, PER_ROUND = 25, 10


def test_a_sweep_that_rejects_hundreds_of_files_keeps_a_bounded_list(tmp_path):
    spool = tmp_path / "spool"
    store = Store(tmp_path / "db.sqlite")
    importer = SpoolImporter(store, spool)  # one importer, as the collector's sweep holds
    seq = 0
    for _ in range(ROUNDS):
        for _ in range(PER_ROUND):
            seq += 1
            write(spool, "bad-run", "s", seq, truncated_gzip())
        assert importer.scan() == 0
        assert len(importer.rejected_files) <= 100  # spool_import.REJECTED_PATHS_KEPT
    rejected = ROUNDS * PER_ROUND
    assert importer.rejected_count == rejected > spool_import.REJECTED_PATHS_KEPT
    # The latest paths, in order: the last one rejected is the last listed.
    assert importer.rejected_files[-1].endswith(f"{seq:012d}.json.gz")
    assert len(importer.rejected_files) == spool_import.REJECTED_PATHS_KEPT
    # Nothing is lost: the run's account lists every file (unreadable: no records to count).
    account = Query(store).detail("bad-run")["delivery"]
    assert len(account["rejected_files"]) == rejected
    store.close()


def test_files_that_could_not_be_set_aside_are_forgotten_once_removed(tmp_path):
    spool = tmp_path / "spool"
    store = Store(tmp_path / "db.sqlite")
    importer = SpoolImporter(store, spool, delete=False, set_aside=False)  # a read-only view
    paths = [write(spool, "bad-run", "s", seq, truncated_gzip()) for seq in range(1, 41)]
    assert importer.scan() == 0 and importer.rejected_count == 40
    assert importer.files() == []  # skipped while they are there: not read again
    for path in paths[:30]:
        path.unlink()  # their producer replayed them
    assert importer.files() == [] and len(importer._skip) == 10
    store.close()
