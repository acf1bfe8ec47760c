"""Bounds on what a decoded request becomes, checked before and after the JSON is parsed.

A small gzip body can hold millions of tiny values (`{}` or `0` repeated): within the size
limits, but parsed each one costs ~30 bytes in the parser and more as Python objects (11 million
`{}` took a collector from 152 MiB to 1.8 GiB). So:
- before parsing, a count of the body's values (an upper bound, from its `,` `[` `{` bytes, at C
  speed) is held to `MAX_JSON_VALUES`: what a request may cost while it is parsed is bounded
  (about 30 bytes a value, ~75 MiB at the limit), whatever its shape;
- after parsing, each free-form part of a batch (the fields of a sample, event, configuration or
  run record that the collector keeps without reading them) is held to a depth, an item count and
  a string length (`free_form_problem`), so what is stored and read back later stays small.
"""
from __future__ import annotations

# The largest real batch (50,000 steps in 9 columns plus 8 phases each) holds ~2.4 M values.
MAX_JSON_VALUES = 3_000_000
FREE_FORM_MAX_DEPTH = 6
FREE_FORM_MAX_ITEMS = 20_000       # values in one free-form field, nested ones included
FREE_FORM_MAX_STRING_CHARS = 1 << 20  # a stack of every thread fits


def json_values_problem(body: bytes) -> str | None:
    """Why `body` holds too many JSON values to parse, or None."""
    values = body.count(b",") + body.count(b"[") + body.count(b"{") + 1
    if values > MAX_JSON_VALUES:
        return (f"the body holds up to {values:,} JSON values, over the limit of {MAX_JSON_VALUES:,}; "
                f"split the batch")
    return None


def free_form_problem(name: str, value: object) -> str | None:
    """Why a free-form field's value is too deep, too long or too big, or None."""
    items = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        items += 1
        if items > FREE_FORM_MAX_ITEMS:
            return f"field {name!r} holds more than {FREE_FORM_MAX_ITEMS:,} values"
        if isinstance(item, str):
            if len(item) > FREE_FORM_MAX_STRING_CHARS:
                return f"field {name!r} holds a string over {FREE_FORM_MAX_STRING_CHARS:,} characters"
        elif isinstance(item, (dict, list)):
            if depth > FREE_FORM_MAX_DEPTH:
                return f"field {name!r} is nested deeper than {FREE_FORM_MAX_DEPTH} levels"
            if items + len(item) > FREE_FORM_MAX_ITEMS:
                return f"field {name!r} holds more than {FREE_FORM_MAX_ITEMS:,} values"
            children = item.values() if isinstance(item, dict) else item
            if isinstance(item, dict):
                for key in item:
                    if len(key) > 200:
                        return f"field {name!r} holds a key over 200 characters"
            stack.extend((child, depth + 1) for child in children)
    return None
