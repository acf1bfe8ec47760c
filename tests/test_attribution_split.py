"""Issue 38 item 1, the interval arithmetic alone: each stage of a wait is the length of its
intersection with what the batch's worker was doing, from hand-built worker records."""
from __future__ import annotations

from starvewatch.hooks.delivery.attribution import split
from starvewatch.stats import WAIT_STAGES
from starvewatch.worker_batches import FIRST


def rec(idx, wait_start, got, fetch, c0, c1, done, flags=0):
    return (idx, wait_start, got, fetch, c0, c1, done, flags)


def stages_of(a, b, history, pos):
    stages = dict.fromkeys(WAIT_STAGES, 0)
    owed = split(a, b, history, pos, stages)
    return owed, {k: v for k, v in stages.items() if v}


def test_a_first_batch_splits_into_startup_idle_fetch_collate_and_handover():
    # The worker started at 100 (waited for indices from then), got them at 110, fetched to
    # 150, collated to 170, handed over at 175; the loop waited from 0 (iter()) to 200.
    history = [rec(0, 100, 110, 111, 150, 170, 175, FIRST)]
    owed, stages = stages_of(0, 200, history, 0)
    assert stages == {"startup": 100, "idle": 10, "fetch": 40, "collate": 25, "handover": 25}
    assert owed == 175


def test_a_wait_behind_the_worker_s_earlier_batch_is_not_scheduled_and_only_overlap_counts():
    # Batch 3 waited behind batch 0 of the same worker (busy until 60); the loop waited 50..120;
    # the fetch of batch 3 ran 61..100, most of it while the loop waited; before 50 nothing counts.
    history = [rec(0, 0, 5, 6, 50, 58, 60), rec(3, 60, 61, 61, 100, 110, 112)]
    owed, stages = stages_of(50, 120, history, 1)
    assert stages == {"not_scheduled": 10, "idle": 1, "fetch": 39, "collate": 12, "handover": 8}
    assert owed == 62 and sum(stages.values()) == 70


def test_the_part_of_the_hand_over_still_in_the_worker_is_counted_apart():
    # Put at 175, its bytes entered the result queue at 190 (the worker's feeder pickled it);
    # the loop waited 180..200: 10 of its 20 ms of hand-over were still the worker's.
    history = [rec(0, 100, 110, 111, 150, 170, 175, FIRST) + (190,)]
    owed, stages = stages_of(150, 200, history, 0)
    assert stages == {"collate": 25, "handover": 25, "handover_send": 15} and owed == 25
    owed, stages = stages_of(180, 200, history, 0)
    assert stages == {"handover": 20, "handover_send": 10} and owed == 0


def test_a_batch_ready_before_the_call_is_all_handover_and_missing_records_are_unknown():
    history = [rec(0, 0, 1, 1, 5, 6, 7)]
    assert stages_of(10, 30, history, 0) == (0, {"handover": 20})
    # Its worker's previous record is gone (a lapped ring): what came before is not guessed.
    history = [rec(7, 40, 45, 45, 60, 61, 62)]
    assert stages_of(0, 70, history, 0) == (62, {"unknown": 40, "idle": 5, "fetch": 15, "collate": 2,
                                                  "handover": 8})


def test_out_of_order_batches_are_taken_in_the_order_they_entered_the_pipe(tmp_path):
    # in_order=False: worker 0 put its batch first (done 100) but its feeder wrote it into the
    # result queue after worker 1's (sent 130 against 120): the loop received worker 1's first.
    from starvewatch.hooks.delivery.attribution import LoaderRecords
    from starvewatch.stats import LoaderTotals
    from starvewatch.worker_batches import RING_BYTES, ring_offset, write
    path = tmp_path / "board"
    path.write_bytes(b"\0" * (2 * RING_BYTES))
    import mmap
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as board:
        write(board, ring_offset(0, 0), rec(0, 10, 20, 20, 0, 0, 100, FIRST) + (130,))
        write(board, ring_offset(0, 1), rec(1, 10, 20, 20, 0, 0, 110, FIRST) + (120,))
    records = LoaderRecords([str(path), 2, 0], {"in_order": False, "prefetch_factor": 2})
    try:
        records.pull(LoaderTotals())
        assert records.find(0, 125, None) == (1, 0)
        assert records.find(1, 140, None) == (0, 0)
        assert records.find(2, 200, None) is None
    finally:
        records.reader.close()


def test_a_reader_taking_over_counts_and_ships_only_what_the_first_did_not(tmp_path):
    # The sidecar read worker 0's first two records and its steps took the first (in_order=False);
    # after it died, this process reads the board again from the sidecar's book.
    from starvewatch.hooks.delivery.attribution import LoaderRecords
    from starvewatch.stats import LoaderTotals
    from starvewatch.worker_batches import RING_BYTES, ring_offset, write
    path = tmp_path / "board"
    path.write_bytes(b"\0" * RING_BYTES)
    import mmap
    config = {"in_order": False, "prefetch_factor": 2}
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as board:
        write(board, ring_offset(0, 0), rec(0, 10, 20, 20, 0, 0, 30, FIRST) + (31,))
        write(board, ring_offset(0, 0), rec(1, 30, 40, 40, 0, 0, 50) + (51,))
        first = LoaderRecords([str(path), 1, 0], config)
        first_totals = LoaderTotals()
        first.pull(first_totals)
        assert first.find(0, 35, None) == (0, 0)
        assert len(first.outbox) == 2
        first.outbox.clear()
        first.shipped = 2
        resume = first.to_dict()
        first.reader.close()
        write(board, ring_offset(0, 0), rec(2, 50, 60, 60, 0, 0, 70) + (71,))
    taken_over = LoaderRecords([str(path), 1, 0], config, resume)
    totals = LoaderTotals()
    try:
        taken_over.pull(totals)
        assert totals.worker_batches == [1] and totals.worker_batch_ns == [10]  # batch 2's only
        assert [r[0] for _, r in taken_over.outbox] == [2] and taken_over.shipped == 2
        # The next steps get batches 1 and 2 (batch 0 went to a step the sidecar joined).
        assert [taken_over.history[0].get(p)[0] for p in (taken_over.find(1, 60, None)[1],
                                                          taken_over.find(2, 80, None)[1])] == [1, 2]
    finally:
        taken_over.reader.close()
