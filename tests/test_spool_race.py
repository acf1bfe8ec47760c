"""A spooled batch the replay is sending while the collector's sweep ingests the same file
(both read the spool): its records are acknowledged once in the account, not also counted as
taken by the sweep (issue 24, item 8: test_faults' account read 465 of 450 steps)."""
import json

from starvewatch.hooks.delivery.spool import Spool
from starvewatch.hooks.delivery.transport import Delivery


def batch(seq: int, n: int) -> dict:
    return {"schema": "starvewatch.events/1", "run_id": "r", "stream": "s", "seq": seq,
            "steps": {"step": list(range(n))}}


class SweptWhileSending:
    """The collector: while it answers the replay's POST, its sweep takes the file and the
    training side's account reads the spool (a reconcile) before the answer arrives."""

    def __init__(self, spool: Spool, sweep: bool) -> None:
        self.spool, self.sweep, self.sent = spool, sweep, []

    def send(self, payload, body=None):
        if self.sweep:
            (self.spool.directory / f"{payload['seq']:012d}.json.gz").unlink()
            self.spool.pending()  # the reconcile: the file vanished (taken by the collector)
            assert f"{payload['seq']:012d}.json.gz" not in self.spool._known()
        self.sent.append(payload["seq"])

    def close(self):
        pass


def test_a_file_swept_during_its_replay_is_acknowledged_once(tmp_path):
    for sweep in (True, False):
        spool = Spool(tmp_path / f"spool-{sweep}", 2**20)
        for seq, n in ((1, 7), (2, 5)):
            spool.write(seq, json.dumps(batch(seq, n)).encode(), n)
        delivery = Delivery(SweptWhileSending(spool, sweep), spool)
        assert delivery.replay() is True
        account = delivery.account()
        assert account == {"acknowledged": 12, "spooled": 0, "dropped": {}}, (sweep, account)
        assert list(spool.directory.iterdir()) == []
