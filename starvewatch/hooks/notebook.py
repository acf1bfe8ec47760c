"""Jupyter kernels (JupyterLab, Notebook, VS Code, Colab): the run's name, cell boundaries, the
idle end of a run, the live page shown inline and the summary as HTML.

IPython is never imported here: everything starts from the shell that a kernel has already
loaded (`sys.modules`), so a script pays nothing and behaves as before.
"""
from __future__ import annotations

import linecache
import logging
import os
import re
import secrets
import sys
import threading
import time
import urllib.parse
import weakref
from pathlib import Path
from time import perf_counter_ns

from ..console import kernel_shell  # noqa: F401  (where it was; session.py imports it from here)

log = logging.getLogger("starvewatch.hooks")

IDLE_POLL_MAX_S = 5.0
_ASSIGNED = re.compile(r"\s*([A-Za-z_][\w.]*)\s*(?::[^=]*)?=(?!=)")


def notebook_run_name(shell) -> str:
    """The notebook's file name when the kernel can know it, else `notebook`.

    JupyterLab and Notebook (jupyter_server 2) give the kernel JPY_SESSION_NAME, the notebook's
    path; VS Code puts `__vsc_ipynb_file__` in the user namespace."""
    candidates = [os.environ.get("JPY_SESSION_NAME")]
    user_ns = getattr(shell, "user_ns", None)
    if isinstance(user_ns, dict):
        candidates.append(user_ns.get("__vsc_ipynb_file__"))
    for path in candidates:
        if isinstance(path, str) and path.strip():
            stem = Path(path.strip().replace("\\", "/")).stem
            if stem:
                return stem
    return "notebook"


# ---- cells ---------------------------------------------------------------------------------

class _Cells:
    """What the kernel is doing, updated by IPython's pre/post_run_cell events (on the thread
    that runs cells). `lock` orders a cell's start after an idle end in progress."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = False
        self.cell_id: str | None = None
        self.unnamed_watches = 0  # unnamed watch() calls in the cell in progress
        self.error_ns = 0  # when the cell's exception reached the shell (perf_counter ns), or 0
        self.registered_on: object | None = None
        # The session module's functions, given by install() (this module imports nothing of it)
        self.current_session = lambda: None
        self.end_idle_run = None


CELLS = _Cells()
# ("cell", cell id, nth unnamed watch in it), ("assigned", target, nth) or ("line", text, nth):
# the name it got, so that a re-run cell's unnamed watch() keeps its name. Bounded.
_NAME_BY_SITE: dict = {}
_NAME_BY_SITE_MAX = 10_000


def install(shell, session, current_session, end_idle_run) -> None:
    """Once per kernel: the cell events; once per run: its idle end. `current_session()` gives
    the run in progress, `end_idle_run(session, idle_s)` ends one."""
    CELLS.current_session, CELLS.end_idle_run = current_session, end_idle_run
    if CELLS.registered_on is not shell:
        shell.events.register("pre_run_cell", _before_cell)
        shell.events.register("post_run_cell", _after_cell)
        _time_tracebacks(shell)
        CELLS.registered_on = shell
        # watch() runs inside a cell: the first one sees the cell start after it.
        CELLS.running = True
    idle_s = session.settings.notebook_idle_s
    if idle_s > 0 and getattr(session, "idle_ender", None) is None:
        session.idle_ender = IdleEnder(session, idle_s)
        session.idle_ender.start()


def _time_tracebacks(shell) -> None:
    """A loop stopped by an exception ends where the exception reached the shell, not after
    the traceback is formatted and shown (a tenth of a second and more: it is highlighted)."""
    original = shell.showtraceback

    def showtraceback(*args, **kwargs):
        if not CELLS.error_ns:
            CELLS.error_ns = perf_counter_ns()
        return original(*args, **kwargs)
    showtraceback.__wrapped__ = original
    shell.showtraceback = showtraceback


def _before_cell(info=None) -> None:
    with CELLS.lock:  # waits for an idle end in progress, so the cell never sees half a finish
        CELLS.running = True
    CELLS.cell_id = getattr(info, "cell_id", None)
    CELLS.unnamed_watches = 0
    CELLS.error_ns = 0


def _after_cell(result=None) -> None:
    """The cell is over: no step stays open across the idle time until the next cell (a loop
    ended by an exception, or `next(it)` called in one cell and again in a later one)."""
    try:
        session = CELLS.current_session()
        if session is not None and session.active and session.pid == os.getpid():
            session.settle_open_steps(threading.get_ident(), CELLS.error_ns or perf_counter_ns())
    except Exception as exc:  # a hook that raises would print a traceback under every cell
        log.warning("starvewatch: closing the cell's steps failed: %s: %s", type(exc).__name__, exc)
    finally:
        CELLS.error_ns = 0
        CELLS.running = False


def unnamed_watch_key(frame) -> tuple | None:
    """Where this unnamed watch() comes from, stable when its cell is re-run with new settings:
    the cell's id (JupyterLab, Notebook 7 and VS Code send one) and the call's rank in the cell;
    without an id, the variable the line assigns (`train = starvewatch.watch(...)`), or else the
    line's text, and that rank."""
    CELLS.unnamed_watches += 1
    if CELLS.cell_id:
        return ("cell", CELLS.cell_id, CELLS.unnamed_watches)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("starvewatch"):
        frame = frame.f_back
    if frame is None:
        return None
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    match = _ASSIGNED.match(line)
    if match:
        return ("assigned", match.group(1), CELLS.unnamed_watches)
    # `for batch in starvewatch.watch(loader):` assigns nothing: the same line run again
    return ("line", line.strip(), CELLS.unnamed_watches) if line.strip() else None


def name_for_site(key) -> str | None:
    return _NAME_BY_SITE.get(key) if key is not None else None


def remember_site(key, name: str) -> None:
    if key is not None and (key in _NAME_BY_SITE or len(_NAME_BY_SITE) < _NAME_BY_SITE_MAX):
        _NAME_BY_SITE[key] = name


# ---- the idle end of a run ----------------------------------------------------------------

def _activity(session) -> tuple:
    """Changes whenever a watched loader takes a step or starts an epoch (read from another
    thread: plain reads of counters and list lengths)."""
    marks = []
    for state in list(session.loader_list):
        ref = state.current
        it = ref() if ref is not None else None
        marks.append((state.totals.epochs, it.current_step() if it is not None else -1,
                      it.waiting_since() if it is not None else None))
    return tuple(marks)


class IdleEnder(threading.Thread):
    """Ends a notebook's run after `idle_s` in which no cell ran and no loader took a step:
    the run shows `finished`, and the next watch() starts a new run of the same name."""

    def __init__(self, session, idle_s: float) -> None:
        super().__init__(name="starvewatch-idle", daemon=True)
        self.session = weakref.ref(session)
        self.idle_s = idle_s
        self.poll_s = min(IDLE_POLL_MAX_S, max(0.05, idle_s / 10))
        self.stopped = threading.Event()

    def run(self) -> None:
        last, since = None, time.monotonic()
        while not self.stopped.wait(self.poll_s):
            session = self.session()
            if session is None or not session.active:
                return
            now = time.monotonic()
            mark = _activity(session)
            if mark != last or CELLS.running:
                last, since = mark, now
                continue
            if now - since < self.idle_s:
                continue
            with CELLS.lock:
                if CELLS.running or _activity(session) != last:
                    continue
                try:
                    CELLS.end_idle_run(session, self.idle_s)
                except Exception as exc:
                    log.warning("starvewatch: ending the idle run failed: %s: %s", type(exc).__name__, exc)
            return


# ---- shown where the user is ----------------------------------------------------------------

def _port_of(url: str) -> int:
    parts = urllib.parse.urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def _without_credentials(url: str) -> str:
    """scheme://host:port/path only: no user:password, no query (a token never goes out)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def run_page_url(settings, run_id: str) -> str | None:
    """Where the user's browser finds the live run page: JupyterHub's proxy template
    (STARVEWATCH_PROXY_URL with %PORT%), Colab's kernel port proxy, or the collector's URL."""
    if settings.url is None:
        return None
    path = f"runs/{urllib.parse.quote(run_id)}"
    template = os.environ.get("STARVEWATCH_PROXY_URL", "").strip()
    if template:
        base = template.replace("%PORT%", str(_port_of(settings.url)))
        return _without_credentials(base.rstrip("/") + "/" + path)
    if "google.colab" in sys.modules:
        proxied = _colab_proxy(_port_of(settings.url))
        if proxied:
            return _without_credentials(proxied.rstrip("/") + "/" + path)
    return _without_credentials(settings.url.rstrip("/") + "/" + path)


COLAB_FRAME_ANCESTORS = "https://colab.research.google.com https://*.googleusercontent.com"


def prepare_environment() -> None:
    """Before a run starts in Colab: a collector this kernel starts lets Colab's output frames
    show its run pages (monitor/web/framing.py reads STARVEWATCH_FRAME_ANCESTORS). Colab's VM is
    reached only through Colab's own authenticated port proxy."""
    if "google.colab" in sys.modules:
        os.environ.setdefault("STARVEWATCH_FRAME_ANCESTORS", COLAB_FRAME_ANCESTORS)


def _colab_proxy(port: int) -> str | None:
    """Colab serves a kernel port to the browser at a URL its frontend gives (as %tensorboard)."""
    try:
        from google.colab import output  # noqa: PLC0415 (only present in Colab)
        url = output.eval_js(f"google.colab.kernel.proxyPort({int(port)}, {{'cache': false}})")
    except Exception as exc:
        log.warning("starvewatch: Colab's port proxy did not answer (%s); linking the collector", exc)
        return None
    return url if isinstance(url, str) and url.startswith(("https://", "http://")) else None


def run_page_html(url: str, height_px: int = 640) -> str:
    """An IFrame of the live page with a plain link beside it: a notebook reopened later
    shows a dead frame, the link still says where the run was. A small script reloads the
    frame once the collector answers (an auto-started one takes a few seconds): a `no-cors`
    fetch fails while nothing listens and succeeds (opaque) once something does."""
    import html
    src = html.escape(url, quote=True)
    frame_id = f"starvewatch-{secrets.token_hex(6)}"
    return (f'<div class="starvewatch-live"><a href="{src}" target="_blank" rel="noopener">'
            f'starvewatch: live run page</a> ({html.escape(url)})<br>'
            f'<iframe id="{frame_id}" src="{src}" width="100%" height="{int(height_px)}" '
            f'frameborder="0"></iframe><script>(function () {{'
            f'var frame = document.getElementById("{frame_id}"), tries = 0, missed = false;'
            f'function probe() {{ if (!frame) return;'
            f'fetch(frame.src, {{mode: "no-cors", cache: "no-store"}}).then(function () {{'
            f'if (missed) frame.src = frame.getAttribute("src"); }}, function () {{'
            f'missed = true; if (++tries < 120) setTimeout(probe, 1000); }}); }}'
            f'probe(); }})();</script></div>')


def show_run(session) -> None:
    """The first watch() of a run in a kernel: the live page inline, once per run."""
    if getattr(session, "shown_inline", False):
        return
    session.shown_inline = True
    url = run_page_url(session.settings, session.run_id)
    if url is None:
        return
    from IPython.display import display  # the kernel has IPython loaded already
    display({"text/html": run_page_html(url),
             "text/plain": f"starvewatch: live run page {url}"}, raw=True)


# ---- the summary, as HTML --------------------------------------------------------------------

def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


class SummaryReport(dict):
    """finish()'s summary (a plain dict for every use). finish() displays it in the cell that
    called it (`show`); shown again as the same cell's value it adds nothing, and in a later
    cell (`summary` alone) it shows again. `_repr_html_` serves other front ends (nbconvert)."""

    shown_in_cell: int | None = None

    def _repr_html_(self) -> str:
        return summary_html(self)

    def _ipython_display_(self) -> None:
        shell = kernel_shell()
        if shell is not None and self.shown_in_cell == getattr(shell, "execution_count", None):
            return  # finish() showed it in this cell already
        self.show()

    def show(self, text: str | None = None) -> None:
        from IPython.display import display  # the kernel has IPython loaded already
        shell = kernel_shell()
        self.shown_in_cell = getattr(shell, "execution_count", None)
        if text is None:
            from .report import format_report
            text = format_report(self)
        display({"text/html": summary_html(self), "text/plain": text}, raw=True)


def summary_html(summary: dict) -> str:
    import html

    from ..analysis.snippet import snippet
    from ..quantities import speedup_text
    from ..analysis.sentences import band_words, headline
    e = html.escape
    run, verdict = summary.get("run", {}), summary.get("verdict", {})
    said = summary.get("answer") or {}
    rows = "".join(
        f"<tr><td>{e(str(l.get('name')))}</td><td>{l.get('steps')}</td>"
        f"<td>{_pct(l.get('input_wait_fraction'))}</td><td>{e(band_words(l.get('verdict')))}</td>"
        f"<td>{(l.get('batches_per_s') or 0):.1f}</td></tr>" for l in summary.get("loaders", []))
    recs = summary.get("recommendations") or []
    items = []
    for r in recs[:3]:
        change = (f"{e(str(r.get('parameter')))}={e(repr(r.get('suggested')))} (now {e(repr(r.get('current')))})"
                  if r.get("parameter") else e(str(r.get("suggested"))))
        gain = (f" <b class='starvewatch-gain'>expected {e(speedup_text(r))} faster</b>"
                if r.get("expected_speedup") else "")
        items.append(f"<li>{e(str(r.get('loader')))}: <b>{change}</b>{gain}: {e(str(r.get('reason', '')))}</li>")
    config = {l.get("name"): l.get("config") for l in summary.get("loaders", [])}
    lines = [code for name in dict.fromkeys(r.get("loader") for r in recs)
             if (code := snippet(config.get(name), recs, name))]
    copy = "".join(f"<div>the line to copy{'' if len(lines) == 1 else ''}:</div>"
                   f"<pre class='starvewatch-snippet'>{e(code)}</pre>" for code in lines)
    return (f'<div class="starvewatch-summary"><b>starvewatch</b>: run {e(str(run.get("name")))} '
            f'(<code>{e(str(run.get("id")))}</code>, {e(str(run.get("status")))}): '
            f'<b>{e(said.get("headline") or headline(summary)) if verdict else ""}</b>'
            + "".join(f"<p>{e(text)}</p>" for text in (said.get("regression"), summary.get("no_recommendation_reason"))
                      if text)
            + '<table><tr><th>loader</th><th>steps</th><th>wait</th><th>verdict</th><th>batches/s</th></tr>'
            f'{rows}</table>' + (f"<ul>{''.join(items)}</ul>" if items else "") + copy + "</div>")
