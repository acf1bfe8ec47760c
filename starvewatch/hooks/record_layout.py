"""The layout of a step record: what the hot path (hooks/loader.py) appends to the buffer and
delivery (hooks/delivery/) reads. A leaf module, so that both import it and not each other.

Two layouts, tuples as short as possible (allocation dominates the hot path):
fast: ((loader index, epoch), step, t_call, t_return, t_next_call, batch size): raw clock
      reads, turned into wait and compute on the shipper thread (or in the sidecar);
full: ((loader index, epoch), step, start, wait, compute, batch size, other, gpu token, phases)
      when step(), phase(), nesting, a CUDA event or the epoch's first batch touched the step.
"""
from __future__ import annotations

R_KEY, R_STEP, R_START, R_WAIT, R_COMPUTE, R_BATCH, R_OTHER, R_GPU, R_PHASES = range(9)
FAST_RECORD_LEN = 6   # (key, step, t_call, t_ret, t_next, batch size): raw clock reads
FULL_RECORD_LEN = 9   # (key, step, t_start, wait, compute, batch size, other, gpu, phases)
