"""`starvewatch export RUN -f trace [--merge PROFILER_TRACE]`: the trace written to a file
(trace_export.py builds it), merged into a torch.profiler trace when asked."""
from __future__ import annotations

import json
import os
import sys

MAX_PROFILER_TRACE_BYTES = 2 << 30  # a profiler trace is read whole: refuse what cannot fit


def write_trace(source, run_id: str, args) -> int:
    from .trace_export import merge
    try:
        trace = source.trace(run_id, steps=args.steps, window=args.window, rank=args.rank)
    except ValueError as exc:
        print(f"starvewatch: {exc}", file=sys.stderr)
        return 2
    if args.merge:
        try:
            if os.path.getsize(args.merge) > MAX_PROFILER_TRACE_BYTES:
                raise ValueError(f"over {MAX_PROFILER_TRACE_BYTES >> 30} GiB")
            with open(args.merge, encoding="utf-8") as f:
                profiler = json.load(f)
            trace = merge(profiler, trace, rank=args.rank or 0)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            print(f"starvewatch: cannot merge into {args.merge}: {exc}", file=sys.stderr)
            return 1
    text = json.dumps(trace)
    if args.output and args.output != "-":
        try:
            with open(args.output, "w", encoding="utf-8") as out:
                out.write(text)
        except OSError as exc:
            print(f"starvewatch: cannot write {args.output}: {exc}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    info = trace.get("starvewatch") or {}
    where = args.output if args.output and args.output != "-" else "standard output"
    print(f"wrote {where}: run {run_id} as a trace ({info.get('events')} events"
          f"{', merged into ' + args.merge if args.merge else ''})", file=sys.stderr)
    if info.get("truncated"):
        print(f"starvewatch: the trace was cut at {info.get('max_events')} events ({info.get('cut_at')}): "
              f"give --steps A:B or --window S:E for the rest", file=sys.stderr)
    return 0
