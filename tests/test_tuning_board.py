"""Rank 0's tuning decisions shared with every rank through a real TCPStore (issue 39 item 5's
board): published ahead of time, read off the training thread, taken at the first decision
point at or after their step; a revert from any rank reaches every rank, the first one wins."""
import threading
from datetime import timedelta

from torch.distributed import TCPStore

from starvewatch.hooks import tuning_board
from starvewatch.hooks.tuning_board import TuningBoard


class _Recorded:
    """The store as a rank sees it, with the threads that called it."""

    def __init__(self, store) -> None:
        self.store, self.threads = store, set()

    def __getattr__(self, name):
        self.threads.add(threading.current_thread())
        return getattr(self.store, name)


def _client(port: int):
    return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))


def _poll_on_a_thread(board) -> threading.Thread:
    t = threading.Thread(target=board.poll, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive()
    return t


def test_decisions_reach_the_other_rank_off_its_training_thread_and_apply_at_their_step():
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    zero = TuningBoard(_client(master.port), "run-1", "train", rank=0)
    one_store = _Recorded(_client(master.port))
    one = TuningBoard(one_store, "run-1", "train", rank=1)
    other_loader = TuningBoard(_client(master.port), "run-1", "val", rank=1)

    poller = _poll_on_a_thread(one)  # nothing published yet: answers at once, nothing due
    assert one.due(10**9) == []
    zero.publish({"num_workers": 2}, at_step=64)
    zero.publish({"num_workers": 4}, at_step=128)
    assert one.due(10**9) == []  # not read yet: the training thread never asks the store
    poller = _poll_on_a_thread(one)
    assert one.due(63) == []
    assert [d["config"]["num_workers"] for d in one.due(70)] == [2]  # the first decision point >= 64
    assert one.due(100) == []
    assert [d["config"]["num_workers"] for d in one.due(128)] == [4]
    assert one_store.threads and threading.current_thread() not in one_store.threads
    assert poller in one_store.threads
    other_loader.poll()  # another loader's board shares nothing
    assert other_loader.decisions == ()


def test_a_revert_from_any_rank_reaches_every_rank_and_the_first_wins():
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    zero = TuningBoard(_client(master.port), "run-2", "train", rank=0)
    one = TuningBoard(_client(master.port), "run-2", "train", rank=1)
    zero.publish({"num_workers": 2}, at_step=16)
    zero.poll()
    assert zero.revert is None
    one.publish_revert({"num_workers": 0}, "ValueError: no workers here")
    zero.publish_revert({"num_workers": 1}, "a later revert")
    zero.poll()
    one.poll()
    for board in (zero, one):
        assert board.revert == {"config": {"num_workers": 0}, "rank": 1, "reason": "ValueError: no workers here"}


def test_without_the_agents_store_there_is_no_board(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert tuning_board.agent_store() is None
