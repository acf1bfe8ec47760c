"""What every `starvewatch` command shares: the exit codes, the error line, text made safe for
a terminal, and the data directory."""
from __future__ import annotations

import sys

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PROBLEMS = 0, 1, 2, 3


def printable(text: str) -> str:
    """Text for a terminal: every invisible character (ids.HIDDEN_CATEGORIES: escapes, bidi
    overrides, line separators...) but the newline shown as a space, so a stored name can
    neither move the cursor nor reorder or fake a line."""
    import unicodedata

    from ..ids import HIDDEN_CATEGORIES
    if text.isascii() and all(c == "\n" or c.isprintable() for c in text):
        return text
    return "".join(c if c == "\n" or unicodedata.category(c) not in HIDDEN_CATEGORIES else " " for c in text)


def fail(message: str, code: int = EXIT_ERROR) -> int:
    print(f"starvewatch: error: {message}", file=sys.stderr)
    return code


def data_dir(args):
    from pathlib import Path

    from ..defaults import default_dir
    return Path(args.dir) if getattr(args, "dir", None) else default_dir()
