"""A summary/1 kept from an earlier version, against this version's summary of the same data:
every field the old summary had, as this version reads an old summary (analysis.summary.upgrade:
the fractions over the wall step); the fields summary/2 added are left out of the comparison."""
from starvewatch.analysis.summary import upgrade


def _restricted(new, old):
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: _restricted(new[k], old[k]) if k in new else new.get(k) for k in old}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [_restricted(n, o) for n, o in zip(new, old)]
    return new


def as_old(new: dict, old_v1: dict) -> tuple[dict, dict]:
    """(the new summary with only the old one's fields, the old one upgraded)."""
    old = upgrade(old_v1)
    return _restricted(new, old), old
