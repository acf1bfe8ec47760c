"""Live tuning under torchrun, two real ranks on gloo (issue 39 item 5): rank 0 decides and
publishes through the agent's store, every rank applies each change at the same step, and the
DistributedSampler's epochs hold every sample once across the ranks."""
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from .conftest import free_port

PROGRAM = Path(__file__).parent / "programs" / "tuned_ranks.py"


def _torchrun(tmp_path, fail_rank: str = "none") -> tuple[list[dict], str]:
    env = {**os.environ, "SW_FAIL_RANK": fail_rank, "STARVEWATCH_RUN_NAME": "tuned-ranks", "SW_OUT": str(tmp_path), "SW_EPOCHS": "8",
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "STARVEWATCH_DIR": str(tmp_path / "sw"),
           "STARVEWATCH_QUIET": "0"}
    env.pop("STARVEWATCH_URL", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(PROGRAM)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for e in range(8):
        both = ranks[0]["epochs"][e] + ranks[1]["epochs"][e]
        assert Counter(both) == Counter(range(128)), e  # every sample once per epoch across ranks
    return ranks, done.stderr


def test_two_ranks_apply_rank_0s_decisions_at_the_same_steps(tmp_path):
    ranks, stderr = _torchrun(tmp_path)
    assert all(r["board"] for r in ranks)  # torchrun's agent store: rank 0 decides for both
    assert ranks[0]["disabled"] is None and ranks[1]["disabled"] is None, ranks
    assert ranks[0]["applied"] == ranks[1]["applied"], ranks  # the same changes at the same steps
    assert [c["num_workers"] for _, c in ranks[0]["applied"]][:1] == [2], ranks[0]["applied"]
    assert len(ranks[0]["applied"]) >= 2  # 0 -> 2 workers, then more changes
    assert ranks[0]["twin_config"] == ranks[1]["twin_config"]
    lines = [l for l in stderr.splitlines() if "rank 0 decides for every rank" in l]
    assert len(lines) == 2, stderr[-2000:]


def test_a_rank_that_cannot_apply_a_change_makes_every_rank_revert(tmp_path):
    """Rank 1's workers cannot start: its 0 -> 2 fails, it reverts (no sample lost) and
    publishes the revert; rank 0 reads it and goes back too; both end with 0 workers, off."""
    ranks, stderr = _torchrun(tmp_path, fail_rank="1")
    assert "num_workers 0 -> 2" in (ranks[1]["disabled"] or ""), ranks[1]
    assert "rank 1 could not apply a change" in (ranks[0]["disabled"] or ""), ranks[0]
    assert ranks[0]["twin_config"]["num_workers"] == ranks[1]["twin_config"]["num_workers"] == 0
