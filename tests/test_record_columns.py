"""records.columns: records of every layout the shipper hands over, mixed, become the wire's
columns step by step (a fast loop's reads records straight from slices of their clock reads)."""
from starvewatch.hooks.delivery.records import columns

KEY = (0, 3)  # loader 0, epoch 3


def test_reads_fast_and_general_path_records_mixed_keep_every_step_in_order():
    t = 1_000_000
    reads = (KEY, 10, 64, [t, t + 5, t + 20, t + 26, t + 40, t + 47, t + 60])       # steps 10-12
    fast = (KEY, 13, t + 60, t + 68, t + 80, 64)                                      # step 13
    general = (KEY, 14, t + 80, 9, 11, 32, 4, 2, {"forward": 6}, t + 89, t + 100, None, t + 80)
    tail = (KEY, 15, 64, [t + 100, t + 103, t + 120, t + 124])                         # step 15 closed, 16 open
    cols = columns([reads, fast, general, tail], ["train"], wall_offset_ns=7)
    assert cols["step"] == [10, 11, 12, 13, 14, 15]
    assert cols["start_ns"] == [7 + t, 7 + t + 20, 7 + t + 40, 7 + t + 60, 7 + t + 80, 7 + t + 100]
    assert cols["wait_ns"] == [5, 6, 7, 8, 9, 3]
    assert cols["compute_ns"] == [15, 14, 13, 12, 11, 17]
    assert cols["other_ns"] == [0, 0, 0, 0, 4, 0]
    assert cols["gpu_idle_ns"] == [None, None, None, None, 2, None]
    assert cols["batch_size"] == [64, 64, 64, 64, 32, 64]
    assert cols["loader"] == ["train"] * 6 and cols["epoch"] == [3] * 6
    assert cols["phases"] == [["train", 3, 14, "forward", 6]]


def test_two_loaders_interleaved_keep_their_own_keys():
    t = 5_000
    a = ((0, 0), 0, 8, [t, t + 1, t + 10, t + 12, t + 20])
    b = ((1, 0), 0, None, [t + 1, t + 2, t + 12, t + 13, t + 22])
    cols = columns([a, b, ((0, 0), 2, t + 20, t + 21, t + 30, 8)], ["main", "aux"], wall_offset_ns=0)
    assert cols["loader"] == ["main", "main", "aux", "aux", "main"]
    assert cols["step"] == [0, 1, 0, 1, 2]
    assert cols["batch_size"] == [8, 8, None, None, 8]
    assert cols["wait_ns"] == [1, 2, 1, 1, 1]
