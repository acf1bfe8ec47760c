"""Do several readers of an IterableDataset yield the same samples? One comparison, used by the
training process (its own workers) and by the collector (the workers of every rank).

Each reader (a worker, on some rank) hashes its first batches in order; readers that forgot to
shard yield the same batch at the same position. Positions hashed by at least two readers are
compared: a repeat by chance (values drawn from a few prototypes) is rare, a missing shard
makes every position repeat.
"""
from __future__ import annotations

MIN_COMPARED = 4  # positions that must be comparable before anything is said
DUPLICATED_SHARE = 0.9  # chance repeats stay well below this share of compared positions


def compare_readers(hashes: list[list[int]]) -> dict | None:
    """{"compared_batches", "repeated_batches", "reads_per_batch", "workers"} for readers'
    hash sequences (0: not hashed yet); None before MIN_COMPARED positions are comparable."""
    compared = repeated = 0
    reads: list[int] = []
    for position in range(max((len(h) for h in hashes), default=0)):
        values = [h[position] for h in hashes if position < len(h) and h[position]]
        if len(values) < 2:
            continue
        compared += 1
        most = max(values.count(v) for v in set(values))
        if most > 1:
            repeated += 1
            reads.append(most)
    if compared < MIN_COMPARED:
        return None
    return {"compared_batches": compared, "repeated_batches": repeated,
            "reads_per_batch": max(reads) if reads else 1, "workers": len(hashes)}


def duplicated(check: dict | None) -> bool:
    return bool(check) and check["repeated_batches"] >= DUPLICATED_SHARE * check["compared_batches"]


def trimmed(hashes: list[int]) -> list[int]:
    """A reader's hashes without the unfilled tail (what a "workers" event carries)."""
    end = len(hashes)
    while end and not hashes[end - 1]:
        end -= 1
    return hashes[:end]
