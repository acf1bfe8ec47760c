"""starvewatch as a user installs it: built into an sdist and a wheel, then run from the
installed copy, never from this source tree.

    python .ci/wheel_smoke.py build OUTDIR      sdist and wheel (the wheel built from the sdist)
    python .ci/wheel_smoke.py demo [--starvewatch PATH] [--installed-in DIR]
        `starvewatch demo --quick` from the installed package: the sidecar and the collector
        it auto-starts must run from the install too (package data included: the dashboard's
        stylesheet). Run it from outside the source tree.

Used by .ci/run (a fresh venv with the wheel installed, non-editable) and by
tests/test_packaging.py (the wheel installed with `pip --target`). Standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the sdist is built from: the files a release needs, not the checkout's caches and outputs.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "starvewatch")
DEMO_TIMEOUT_S = 180
SWEEP_WAIT_S = 30  # the collector sweeps the spool every 5 s


def build(outdir: Path) -> tuple[Path, Path]:
    """The sdist, then the wheel built from it (what `python -m build` does), in `outdir`.
    Built from a copy, so the checkout gets no build/ or egg-info; --no-isolation uses the
    setuptools installed here (the test extra), so only the package index is ever reached."""
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="starvewatch-src-") as tmp:
        src = Path(tmp) / "starvewatch-src"
        src.mkdir()
        for name in SOURCES:
            path = REPO / name
            if path.is_dir():
                shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, src / name)
        subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir), str(src)],
                       check=True, stdout=subprocess.DEVNULL)
    sdists, wheels = sorted(outdir.glob("*.tar.gz")), sorted(outdir.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise SystemExit(f"expected one sdist and one wheel in {outdir}, found {sdists + wheels}")
    return sdists[0], wheels[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.headers.get("content-type", ""), response.read()


def _package_seen_by(pid: int) -> Path:
    """The starvewatch package that process `pid` imports: its interpreter, run with its
    environment in its working directory (`-m` puts that directory first on the path)."""
    proc = Path(f"/proc/{pid}")
    raw = (proc / "environ").read_bytes()
    env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
    code = "import starvewatch; print(starvewatch.__file__)"  # -c, like -m, puts the cwd first
    # argv[0], not /proc/PID/exe: a venv's python is a symlink, and the venv is found through it
    interpreter = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
    out = subprocess.run([interpreter, "-c", code], env=env, cwd=os.readlink(proc / "cwd"),
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).parent.resolve()


def demo(starvewatch: str, installed_in: Path | None) -> None:
    """Run `starvewatch demo --quick` and check what a user would: it ends well, its runs went
    to the collector it started, and that collector serves the API and the dashboard with its
    stylesheet, from the installed package. Then a plain script whose sidecar starts one."""
    check = subprocess.run([sys.executable, "-c", "import starvewatch; print(starvewatch.__file__)"],
                           capture_output=True, text=True, check=True)
    package_dir = Path(check.stdout.strip()).parent
    if REPO in package_dir.parents:
        raise SystemExit(f"starvewatch was imported from the source tree ({package_dir}), not an install")
    if installed_in is not None and installed_in.resolve() not in package_dir.resolve().parents:
        raise SystemExit(f"starvewatch was imported from {package_dir}, not from {installed_in}")
    for name in ("py.typed", "dashboard/assets/style.css", "record_layout.py"):
        if not (package_dir / name).is_file():
            raise SystemExit(f"the installed package has no {name}")

    with tempfile.TemporaryDirectory(prefix="starvewatch-demo-") as tmp:
        data_dir = Path(tmp) / "data"
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        # A new user's environment: none of the caller's STARVEWATCH_* settings (a test's
        # no-autostart or quiet), a data directory of its own and a free port.
        env = {k: v for k, v in os.environ.items() if not k.startswith("STARVEWATCH_")}
        env.update(STARVEWATCH_DIR=str(data_dir), STARVEWATCH_URL=url)
        try:
            started = time.monotonic()
            out = subprocess.run([starvewatch, "demo", "--quick"], cwd=tmp, env=env, capture_output=True,
                                 text=True, timeout=DEMO_TIMEOUT_S)
            took_s = time.monotonic() - started
            print(out.stdout, end="")
            print(out.stderr, end="", file=sys.stderr)
            if out.returncode != 0:
                raise SystemExit(f"`starvewatch demo --quick` exited with {out.returncode}")
            if "could not start" in out.stderr:  # the sidecar fell back to the training process
                raise SystemExit("the sidecar did not start from the installed package")
            if "before -> after" not in out.stdout or f"live dashboard at {url}/runs/" not in out.stderr:
                raise SystemExit("the demo did not end with its comparison, or never reached its collector")
            info = json.loads((data_dir / "collector.json").read_text())
            status, _, body = _get(f"{url}/healthz")
            if status != 200 or json.loads(body)["service"] != "starvewatch" or json.loads(body)["pid"] != info["pid"]:
                raise SystemExit(f"the collector at {url} is not the one the demo started: {body[:200]!r}")
            # What the collector imported: the same interpreter, environment and working
            # directory resolve `starvewatch` to the installed package.
            seen_from = _package_seen_by(info["pid"])
            if seen_from != package_dir.resolve():
                raise SystemExit(f"the collector runs starvewatch from {seen_from}, not from {package_dir}")
            # Both runs end up in the collector: sent to it, or (a run that ended before its
            # sidecar found the collector) spooled and swept in within the collector's sweep.
            deadline = time.monotonic() + SWEEP_WAIT_S
            while True:
                runs = json.loads(_get(f"{url}/api/v1/runs")[2])["runs"]
                if sorted(run["name"] for run in runs) == ["demo", "demo"] or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            if sorted(run["name"] for run in runs) != ["demo", "demo"]:
                raise SystemExit(f"expected the demo's two runs in the collector, found {runs}")
            status, ctype, body = _get(f"{url}/runs/{runs[0]['id']}")
            if status != 200 or not ctype.startswith("text/html"):
                raise SystemExit(f"the dashboard did not serve the run page ({status}, {ctype})")
            status, ctype, body = _get(f"{url}/assets/style.css")
            if status != 200 or not ctype.startswith("text/css") or not body.strip():
                raise SystemExit(f"the dashboard's stylesheet is not served ({status}, {ctype}, {len(body)} bytes)")
            print(f"wheel smoke: demo --quick from {package_dir} in {took_s:.1f} s; collector pid "
                  f"{info['pid']} served API, dashboard and stylesheet")
        finally:
            # The auto-started collector outlives the demo (that is its job): stop it by its pid file.
            subprocess.run([starvewatch, "stop", "--dir", str(data_dir)], env=env, cwd=tmp,
                           capture_output=True, timeout=30)
    script_with_sidecar(starvewatch, package_dir)


# A training loop as a user writes it, that goes on until a collector has been started for it
# (its pid file appears), within a deadline: the sidecar finds no collector and starts one.
SCRIPT = """
import sys, time
from pathlib import Path
import starvewatch
pid_file = Path(sys.argv[1]) / "collector.json"
deadline = time.monotonic() + 60
for step in starvewatch.watch(range(1_000_000), name="train"):
    time.sleep(0.002)
    if step >= 100 and pid_file.exists() or time.monotonic() > deadline:
        break
print(starvewatch.finish()["run"]["id"])
"""


def script_with_sidecar(starvewatch: str, package_dir: Path) -> None:
    """A plain training script: its sidecar (a process of its own) starts the collector, and
    both run from the installed package; the run reaches that collector."""
    with tempfile.TemporaryDirectory(prefix="starvewatch-script-") as tmp:
        data_dir = Path(tmp) / "data"
        url = f"http://127.0.0.1:{_free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STARVEWATCH_")}
        env.update(STARVEWATCH_DIR=str(data_dir), STARVEWATCH_URL=url)
        (Path(tmp) / "train.py").write_text(SCRIPT)
        try:
            out = subprocess.run([sys.executable, "train.py", str(data_dir)], cwd=tmp, env=env,
                                 capture_output=True, text=True, timeout=DEMO_TIMEOUT_S)
            print(out.stderr, end="", file=sys.stderr)
            if out.returncode != 0 or "could not start" in out.stderr:
                raise SystemExit(f"the training script failed ({out.returncode}) or ran without its sidecar")
            run_id = out.stdout.strip().splitlines()[-1]
            info = json.loads((data_dir / "collector.json").read_text())
            seen_from = _package_seen_by(info["pid"])
            if seen_from != package_dir.resolve():
                raise SystemExit(f"the collector the sidecar started runs starvewatch from {seen_from}")
            deadline = time.monotonic() + SWEEP_WAIT_S
            while run_id not in (ids := [r["id"] for r in json.loads(_get(f"{url}/api/v1/runs")[2])["runs"]]):
                if time.monotonic() > deadline:
                    raise SystemExit(f"the script's run {run_id} never reached the collector (runs: {ids})")
                time.sleep(0.5)
            print(f"wheel smoke: a script's sidecar started the collector (pid {info['pid']}) from "
                  f"{package_dir}; run {run_id} stored")
        finally:
            subprocess.run([starvewatch, "stop", "--dir", str(data_dir)], env=env, cwd=tmp,
                           capture_output=True, timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("outdir", type=Path)
    d = sub.add_parser("demo")
    d.add_argument("--starvewatch", default=shutil.which("starvewatch"), help="the installed console script")
    d.add_argument("--installed-in", type=Path, help="the directory the package must be imported from")
    args = parser.parse_args(argv)
    if args.command == "build":
        for path in build(args.outdir):
            print(path)
    else:
        if not args.starvewatch:
            raise SystemExit("no `starvewatch` command found: pass --starvewatch")
        demo(args.starvewatch, args.installed_in)


if __name__ == "__main__":
    main()
