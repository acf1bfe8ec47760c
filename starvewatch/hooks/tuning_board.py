"""Live tuning under torchrun (issue 39 item 5): rank 0's decisions, for every rank, through the
store the job already shares its run id in (the torchrun agent's TCPStore, hooks/identity.py).

Rank 0 publishes "apply configuration C at step S" ahead of time (`publish`); a rank that cannot
apply one publishes a revert (`publish_revert`), which every rank then applies. The store is
read off the training thread only (`poll`, called by a background thread: the sampler's or the
tuner's); the training thread takes what is due at a decision point (`due`) from what `poll`
swapped in, without touching the store, so it never blocks on it.

Keys, under one prefix per run and loader: `n` (how many decisions, an integer counter read
with add(key, 0), which never blocks), `d<k>` (decision k, JSON), `reverts` and `revert`
(the first revert wins, by compare-and-set).

hooks/live_tuner.py uses it at epoch boundaries only (a mid-epoch decision point depends on
each rank's own window)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading

log = logging.getLogger("starvewatch.hooks")

KEY_PREFIX = "starvewatch/tune/"
STORE_TIMEOUT_S = 5.0


def agent_store():
    """A client of the torchrun agent's store, or None where the job has none (then tuning
    runs per rank, and says so)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() != "true":
        return None
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore
        return TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))
    except Exception as exc:  # no torch.distributed, or the store unreachable
        log.warning("starvewatch: tuning: the torchrun agent's store at %s:%s did not answer (%s)",
                    addr, port, type(exc).__name__)
        return None


class TuningBoard:
    """One loader's decisions in one run, shared by every rank."""

    def __init__(self, store, run_id: str, loader_name: str, rank: int) -> None:
        digest = hashlib.sha1(f"{run_id}\0{loader_name}".encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.prefix = KEY_PREFIX + digest + "/"
        self.store = store
        self.rank = rank
        self.published = 0  # rank 0: decisions written
        # What poll() read, swapped whole (one attribute each): read by the training thread.
        self.decisions: tuple[dict, ...] = ()
        self.revert: dict | None = None
        self.applied = 0  # training thread: decisions handed out by due()

    # ---- rank 0 (publishing is a few small writes: at a decision point, once per window) ----
    def publish(self, config: dict, at_step: int) -> dict:
        """Every rank applies `config` at its first decision point at or after `at_step`."""
        decision = {"k": self.published, "config": dict(config), "at_step": int(at_step)}
        self.store.set(f"{self.prefix}d{self.published}", json.dumps(decision))
        self.published += 1
        self.store.add(self.prefix + "n", 1)  # after the decision's key: a reader of n finds it
        self.decisions = self.decisions + (decision,)  # rank 0 takes its own without a poll
        return decision

    # ---- any rank -------------------------------------------------------------------------
    def publish_revert(self, config: dict, reason: str) -> None:
        """This rank could not apply a decision: every rank goes back to `config` (the last good
        one) and tuning stops. The first revert published is the one every rank applies."""
        revert = json.dumps({"config": dict(config), "rank": self.rank, "reason": reason[:200]})
        self.store.compare_set(self.prefix + "revert", "", revert)
        self.store.add(self.prefix + "reverts", 1)

    def poll(self) -> None:
        """Off the training thread: the decisions and revert published since the last poll."""
        count = int(self.store.add(self.prefix + "n", 0))
        known = self.decisions
        if count > len(known):
            new = [json.loads(self.store.get(f"{self.prefix}d{k}")) for k in range(len(known), count)]
            self.decisions = known + tuple(new)
        if self.revert is None and int(self.store.add(self.prefix + "reverts", 0)) > 0:
            self.revert = json.loads(self.store.get(self.prefix + "revert"))

    def start_polling(self, interval_s: float = 0.01) -> None:
        """A daemon thread that polls until `stop_polling` (a store gone: it stops, logged)."""
        self._halt = threading.Event()
        threading.Thread(target=self._poll_loop, args=(interval_s,), name="starvewatch-tuning-board",
                         daemon=True).start()

    def stop_polling(self) -> None:
        halt = getattr(self, "_halt", None)
        if halt is not None:
            halt.set()

    def _poll_loop(self, interval_s: float) -> None:
        while not self._halt.wait(interval_s):
            try:
                self.poll()
            except Exception as exc:
                log.warning("starvewatch: tuning: the store stopped answering (%s)", type(exc).__name__)
                return

    def due(self, step: int) -> list[dict]:
        """Training thread, at a decision point at `step`: the decisions to apply now, in order
        (those read so far whose step has come). Reads no store."""
        decisions = self.decisions
        out = []
        while self.applied < len(decisions) and decisions[self.applied]["at_step"] <= step:
            out.append(decisions[self.applied])
            self.applied += 1
        return out
