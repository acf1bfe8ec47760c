"""`starvewatch demo`: a synthetic CPU training that is visibly starved, then fixed.

The dataset's items take a few milliseconds to "load" (a sleep, like a read from slow storage
or a network filesystem); the model step takes a few milliseconds of real CPU work. With
num_workers=0 the two are serialized on the training thread; the diagnosis says what to change,
and the second run applies it.
"""
from __future__ import annotations

import time


def _dataset(n_items: int, load_ms: float):
    import torch
    from torch.utils.data import Dataset

    class SyntheticImages(Dataset):
        def __len__(self):
            return n_items

        def __getitem__(self, i):
            time.sleep(load_ms / 1000)
            g = torch.Generator().manual_seed(i)
            return torch.rand(3, 16, 16, generator=g), i % 10

    return SyntheticImages()


def _train(loader, epochs: int, compute_ms: float) -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(768, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # The step stands in for GPU work: one intra-op thread (a tiny model gains nothing from more,
    # and spinning OpenMP threads on a busy host would take the cores the workers need).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _epochs(loader, model, opt, epochs, compute_ms)
    finally:
        torch.set_num_threads(threads)


def _epochs(loader, model, opt, epochs: int, compute_ms: float) -> None:
    import torch

    for _ in range(epochs):
        for x, y in loader:
            t_end = time.perf_counter() + compute_ms / 1000
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # Pad to a GPU-like step: the training thread waits for its kernels, cores stay free.
            time.sleep(max(0.0, t_end - time.perf_counter()))


def run_demo(quick: bool = False, name: str = "demo", out=None) -> tuple[dict, dict | None]:
    """Run the starved configuration, then the recommended one; return both summaries."""
    import sys
    import warnings

    # torch warns when workers outnumber cores; latency-bound workers (sleeping on reads) are
    # exactly the case where more workers than cores is right.
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    import starvewatch
    from torch.utils.data import DataLoader

    out = out or sys.stdout
    # One long epoch: workers start once, as in a real training's epoch of thousands of steps
    # (short epochs would make the demo about worker start-up, not about loading).
    items, epochs, batch = (512, 1, 16) if quick else (3072, 1, 16)
    load_ms, compute_ms = 1.5, 12.0
    dataset = _dataset(items, load_ms)

    _collector_up_first()
    print(f"[1/2] starved configuration: DataLoader(batch_size={batch}, num_workers=0)", file=out, flush=True)
    starvewatch.init(name)
    loader = starvewatch.watch(DataLoader(dataset, batch_size=batch, num_workers=0), name="train")
    _train(loader, epochs, compute_ms)
    before = starvewatch.finish()

    # The configuration to apply is the engine's own (the same as the report's snippet).
    plan = next((p for p in before.get("plans") or [] if p["loader"] == "train"), None)
    if plan is None:
        return before, None
    kwargs = dict(plan["config"])
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    print(f"[2/2] recommended configuration: DataLoader({shown})", file=out, flush=True)
    starvewatch.init(name)
    loader = starvewatch.watch(DataLoader(dataset, **kwargs), name="train")
    _train(loader, epochs, compute_ms)
    session = _current_session()
    after = starvewatch.finish()
    # Read after finish(): the sidecar announces the collector asynchronously, and a quick run
    # can end before it has.
    dashboard = _dashboard_base(session)
    print(compare_hint(before["run"]["id"], after["run"]["id"], dashboard), file=out, flush=True)
    note = background_note(dashboard, session.settings.dir if session is not None else None)
    if note:
        print(note, file=out, flush=True)
    return before, after


def background_note(dashboard: str | None, directory) -> str | None:
    """When the demo's runs went to a collector started for it: that it keeps running, for how
    long, and how to stop it (a newcomer otherwise finds a server they never started)."""
    import json
    from pathlib import Path
    if not dashboard or directory is None:
        return None
    try:
        started_for_you = json.loads((Path(directory) / "collector.json").read_text()).get("autostarted")
    except (OSError, ValueError, AttributeError):
        return None
    if not started_for_you:
        return None
    return (f"the collector started for this demo keeps running in the background, with your runs at "
            f"{dashboard}: it stops after an hour with no live run, or now with `starvewatch stop`")


def _collector_up_first() -> None:
    """Find (or start, as the first watch() would) the collector before the first run: a quick
    run lasts about a second, less than a collector's start-up, and would otherwise go to the
    spool and reach the dashboard only at the collector's next spool sweep."""
    from .hooks.delivery.collector_link import find_collector
    from .hooks.delivery.transport import HttpTransport
    from .hooks.settings import HookSettings
    settings = HookSettings.from_env()
    if settings.url is None or settings.disabled:
        return
    transport = HttpTransport(settings.url, settings.token, timeout_s=2.0)
    try:
        find_collector(settings.url, settings.dir, transport, autostart=settings.autostart, local_rank=0)
    finally:
        transport.close()


def _current_session():
    from .hooks.session import current_session
    return current_session()


def _dashboard_base(session) -> str | None:
    """The collector's dashboard this run reached (None when it ran offline, into the spool)."""
    url = session.dashboard_url if session is not None else None
    return url.rsplit("/runs/", 1)[0] if url else None


def compare_hint(before_id: str, after_id: str, dashboard: str | None) -> str:
    """Where to see the before/after: the compare page when a collector has both runs."""
    from urllib.parse import quote
    if dashboard:
        return f"compare before and after: {dashboard}/compare?a={quote(before_id)}&b={quote(after_id)}"
    return f"compare before and after: starvewatch compare {before_id} {after_id}"
