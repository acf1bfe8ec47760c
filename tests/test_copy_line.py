"""The line to copy runs (issue 34 item 5): every recommendation the scenario harness produced
(benchmarks/results/scenarios.json, real runs' advice), applied to the scenario's real
DataLoader, gives a line that constructs against the scenario's dataset and yields a batch.
No timing: each loader yields one batch."""
import json
from pathlib import Path

import pytest

from benchmarks.scenarios.cases import SCENARIOS
from benchmarks.scenarios.run import _loader, copied_loader
from starvewatch.hooks.introspect import dataloader_config
from starvewatch.monitor.outputs.export import is_call, snippet

ROWS = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "scenarios.json").read_text())["rows"]
BY_NAME = {s.name: s for s in SCENARIOS}
CASES = [(row["name"], loader) for row in ROWS if row["name"] in BY_NAME
         for loader in sorted({r["loader"] for r in row["recommendations"] if r.get("parameter")})
         if not BY_NAME[row["name"]].loaders[loader].plain]


def test_the_harness_produced_lines_to_check():
    assert len(CASES) >= 10, CASES


# A CPU-only machine: torch warns that pinned memory has no accelerator (the advice is a GPU host's).
@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")
@pytest.mark.parametrize("scenario,loader", CASES)
def test_every_line_to_copy_constructs_and_yields_a_batch(scenario, loader):
    spec = BY_NAME[scenario].loaders[loader]
    recs = next(row for row in ROWS if row["name"] == scenario)["recommendations"]
    config = dataloader_config(_loader(spec, spec.kwargs))  # what watch() records of the real loader
    code = snippet(config, recs, loader)
    assert code is not None
    copied = copied_loader(spec, config, recs, loader)
    it = iter(copied)
    assert next(it) is not None
    del it  # its workers end here
    # The user's settings are kept, not only the changed ones.
    if is_call(code):
        for key in ("drop_last", "shuffle"):
            if spec.kwargs.get(key):
                assert f"{key}=True" in code, code
        kept = spec.kwargs.get("num_workers")
        changed = {r["parameter"] for r in recs if r["loader"] == loader}
        if kept and "num_workers" not in changed:
            assert f"num_workers={kept}" in code, code


def test_a_line_keeps_workers_shuffle_and_earlier_changes():
    """The reproduction: prefetch_factor=4 and persistent_workers=True advised for a loader with
    num_workers=1 (torch raises on prefetch_factor without workers), shuffle=True and a
    prefetch_factor applied in an earlier round."""
    from torch.utils.data import DataLoader, TensorDataset
    import torch
    dataset = TensorDataset(torch.arange(64.0))
    user = DataLoader(dataset, batch_size=8, shuffle=True, num_workers=1, prefetch_factor=4, drop_last=True)
    recs = [{"loader": "train", "parameter": "persistent_workers", "current": False, "suggested": True, "kind": "speedup"}]
    code = snippet(dataloader_config(user), recs, "train")
    assert code == ("DataLoader(dataset, batch_size=8, shuffle=True, num_workers=1, drop_last=True, "
                    "persistent_workers=True, prefetch_factor=4)")
    assert len(list(eval(code, {"DataLoader": DataLoader, "dataset": dataset}))) == 8
