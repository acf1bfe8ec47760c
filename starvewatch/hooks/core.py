"""Which implementation runs the hot path's fast `__next__`s: compiled or pure Python.

Like coverage.py's C tracer beside its Python one: the compiled core (starvewatch/_ccore.c,
built by `pip install` where a C compiler is found) is chosen at import where it loads and
works; pure Python runs everywhere else (no compiler, PyPy, a free-threaded build, a broken
extension). `STARVEWATCH_CORE=python|c` forces either; a value that is neither, or `c` where
the extension is unavailable, says so in one console line (at the run's start) and runs the default. Nothing here
can stop training: any failure of the extension means the Python core.

Only the fast classes' `__next__` (FastWatchedIterator's and FastGpuWatchedIterator's) and
the container of a segment's reads differ between the two: the class switching, the general
path and everything delivery reads are hooks/loader.py's, so the records match.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from importlib import import_module
from time import perf_counter_ns

ENV = "STARVEWATCH_CORE"
CORES = ("c", "python")

_fast_cls = None
_general_cls = None
_gpu_cls = None
_python_next = None  # FastWatchedIterator.__next__ as loader.py defines it
_python_gpu_next = None  # FastGpuWatchedIterator.__next__ as loader.py defines it
_c_next = None  # the compiled ones, bound to WatchedIterator; None where unavailable
_c_gpu_next = None
_unavailable = "not loaded yet"  # why the compiled core cannot run, when it cannot
_current = "python"


def _load_c(general_cls) -> tuple[tuple | None, str]:
    """((the compiled fast __next__, the CUDA one), "") or (None, why not)."""
    if sys.implementation.name != "cpython":
        return None, f"{sys.implementation.name} runs the Python core"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None, "a free-threaded build runs the Python core (the fast path relies on the GIL)"
    try:
        _ccore = import_module("starvewatch._ccore")  # optional: built only where a compiler was
    except ModuleNotFoundError:
        return None, "the compiled extension is not installed (no C compiler at install time?)"
    except Exception as exc:  # a broken build (a bad file, another ABI) must never stop training
        return None, f"the compiled extension failed to load ({type(exc).__name__}: {exc})"
    try:
        # the same clock as time.perf_counter_ns, or records from the two paths would not match
        before = perf_counter_ns()
        reading = _ccore.clock_ns()
        after = perf_counter_ns()
        if not before <= reading <= after:
            return None, "the compiled extension's clock is not time.perf_counter_ns's"
        fast = _ccore.bind(general_cls, general_cls.__next__, general_cls._fast_failed)
        gpu = _ccore.bind_gpu(general_cls, general_cls._gpu_fast_drop, general_cls._gpu_fast_failed)
        return (fast, gpu), ""
    except Exception as exc:
        return None, f"the compiled extension could not be bound ({type(exc).__name__}: {exc})"


_notice = ""  # what the choice has to say on the console, said once by the run's init()


def _say(message: str) -> None:
    global _notice
    _notice = f"starvewatch: {message}"


def take_notice() -> str:
    """The one console line about the choice ("" when there is none), once: the training
    process's init() says it (not the sidecar, which imports the hooks too)."""
    global _notice
    notice, _notice = _notice, ""
    return notice


def select(fast_cls, general_cls, gpu_cls, environ=os.environ) -> str:
    """At import of hooks/loader.py: install the core the environment asks for (default: c
    where available). Returns its name."""
    global _fast_cls, _general_cls, _gpu_cls, _python_next, _python_gpu_next, _c_next, _c_gpu_next, _unavailable
    _fast_cls, _general_cls, _gpu_cls = fast_cls, general_cls, gpu_cls
    _python_next, _python_gpu_next = fast_cls.__dict__["__next__"], gpu_cls.__dict__["__next__"]
    compiled, _unavailable = _load_c(general_cls)
    _c_next, _c_gpu_next = compiled if compiled is not None else (None, None)
    default = "c" if _c_next is not None else "python"
    raw = environ.get(ENV)
    wanted = default if raw is None or not raw.strip() else raw.strip().lower()
    if wanted not in CORES:
        _say(f"{ENV}={raw!r} is neither 'python' nor 'c': using the {default} core")
        wanted = default
    elif wanted == "c" and _c_next is None:
        _say(f"{ENV}=c but {_unavailable}: using the python core")
        wanted = "python"
    try:
        return use(wanted)
    except Exception as exc:  # the extension misbehaves: never stop training over it
        _c_next, _unavailable = None, f"the compiled extension could not be installed ({type(exc).__name__}: {exc})"
        _say(f"{_unavailable}: using the python core")
        return use("python")


def use(core: str) -> str:
    """Switch the fast path to `core` ("c" or "python"), also for live iterators (tests and
    benchmarks run both in one process). ValueError for an unknown or unavailable core."""
    global _current
    if core not in CORES:
        raise ValueError(f"core must be one of {CORES}, not {core!r}")
    if core == "c" and _c_next is None:
        raise ValueError(f"the c core is unavailable: {_unavailable}")
    _fast_cls.__next__ = _c_next if core == "c" else _python_next  # sets the type's slot too
    _gpu_cls.__next__ = _c_gpu_next if core == "c" else _python_gpu_next
    if core == "c":
        _ccore = import_module("starvewatch._ccore")
        _ccore.install_iternext(_fast_cls)  # the slots call the C functions directly
        _ccore.install_iternext(_gpu_cls)
        _general_cls._new_times = _ccore.Times  # segments begun from now on; running ones go on
    else:
        _general_cls._new_times = list
    _current = core
    return core


def current() -> str:
    """The core running now: "c" or "python" (the run's metadata and `starvewatch doctor`)."""
    return _current


def c_available() -> bool:
    return _c_next is not None


def why_not_c() -> str:
    """Why the compiled core cannot run here ("" where it can)."""
    return "" if _c_next is not None else _unavailable
