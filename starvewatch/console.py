"""Where the training process's informational lines go: stderr in a script (stdout stays the
user's), stdout in a Jupyter kernel, which draws stderr in red as if it were an error.
Warnings stay on stderr everywhere. IPython is never imported here: a kernel has loaded it."""
from __future__ import annotations

import sys


def kernel_shell():
    """The IPython shell of the Jupyter kernel this process is, or None (a script, plain
    IPython in a terminal). A kernel's shell has a `kernel`; the terminal's has none."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    if get is None:
        return None
    try:
        shell = get()
    except Exception:
        return None
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def info_stream():
    return sys.stdout if kernel_shell() is not None else sys.stderr
