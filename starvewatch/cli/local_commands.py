"""The commands that run on this machine alone: demo, doctor, tune."""
from __future__ import annotations

import sys

from .cli_basics import EXIT_ERROR, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, data_dir, fail


def cmd_demo(args) -> int:
    from ..demo import run_demo
    from ..analysis.compare import comparison
    from ..monitor.outputs.compare_report import to_markdown
    before, after = run_demo(quick=args.quick, name=args.name)
    if after is None:
        print("no recommendation to apply: the starved run's summary is above", file=sys.stderr)
        return EXIT_OK
    print("\nbefore -> after", flush=True)
    print(to_markdown(comparison(before, after)), flush=True)
    return EXIT_OK


def cmd_doctor(args) -> int:
    from ..doctor import run_checks
    problems = 0
    for name, ok, detail, fix in run_checks(data_dir(args)):
        mark = "ok " if ok else "!! "
        print(f"{mark}{name}: {detail}")
        if not ok and fix:
            print(f"    fix: {fix}")
        problems += 0 if ok else 1
    return EXIT_OK if problems == 0 else EXIT_PROBLEMS


def cmd_tune(args) -> int:
    from ..tuning import FactoryError, TrialFailed, tune
    from ..tuning.remote import CollectorError
    if args.budget <= 0:
        return fail("--budget must be a positive number of seconds", EXIT_USAGE)
    if args.consumption is not None and args.consumption <= 0:
        return fail("--consumption must be a positive number of batches per second", EXIT_USAGE)
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        return fail("--checkpoint-every must be a positive number of steps", EXIT_USAGE)
    try:
        result = tune(args.factory, budget_s=args.budget, consumption_batches_per_s=args.consumption,
                      run_name=args.run, loader=args.loader, checkpoint_every=args.checkpoint_every)
    except (FactoryError, CollectorError, TrialFailed) as exc:
        return fail(str(exc))
    return EXIT_OK if result.answer is not None and result.stored is not False else EXIT_ERROR
