"""Ready to publish: the sdist and the wheel as `python -m build` makes them (the wheel from the
sdist), with the license, the metadata an index shows and the package data an installed copy
needs; then the wheel installed (not editable) runs `starvewatch demo --quick`, whose sidecar
and auto-started collector run from the install. .ci/run does the same in a fresh venv."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from trove_classifiers import classifiers as KNOWN_CLASSIFIERS

REPO = Path(__file__).resolve().parent.parent
# sha256 of the Apache License 2.0 as apache.org publishes it (LICENSE-2.0.txt)
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def _wheel_smoke():
    spec = importlib.util.spec_from_file_location("wheel_smoke", REPO / ".ci" / "wheel_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> tuple[Path, Path]:
    return _wheel_smoke().build(tmp_path_factory.mktemp("dist"))


def _source_modules() -> set[str]:
    return {p.relative_to(REPO).as_posix() for p in (REPO / "starvewatch").rglob("*.py")
            if "__pycache__" not in p.parts}


def test_the_license_is_the_apache_2_text():
    assert hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256


def test_the_wheel_carries_every_module_the_license_the_metadata_and_the_package_data(dist):
    _, wheel = dist
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(f"{info}/METADATA").decode())
        license_text = zf.read(f"{info}/licenses/LICENSE")
        entry_points = zf.read(f"{info}/entry_points.txt").decode()
    assert _source_modules() <= names, sorted(_source_modules() - names)
    assert {"starvewatch/py.typed", "starvewatch/dashboard/assets/style.css", "starvewatch/record_layout.py"} <= names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/")) or "__pycache__" in n]
    assert license_text == (REPO / "LICENSE").read_bytes()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.10"
    urls = dict(entry.split(", ", 1) for entry in metadata.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Repository", "Issues", "Changelog"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values()), urls
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert [c for c in classifiers if c not in KNOWN_CLASSIFIERS] == []  # an index rejects unknown ones
    assert not [c for c in classifiers if c.startswith("License ::")]  # the expression says it (PEP 639)
    assert "starvewatch = starvewatch.cli:main" in entry_points
    # the README is the long description an index shows
    assert metadata.get_payload().startswith((REPO / "README.md").read_text()[:200])


def test_the_sdist_holds_what_the_wheel_is_built_from(dist):
    sdist, _ = dist
    with tarfile.open(sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "PKG-INFO", "starvewatch/py.typed",
            "starvewatch/dashboard/assets/style.css"} <= names
    assert _source_modules() <= names, sorted(_source_modules() - names)


def test_the_installed_wheel_runs_the_demo_and_a_script_whose_sidecar_starts_the_collector(dist, tmp_path):
    _, wheel = dist
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(target), str(wheel)], check=True)
    workdir = tmp_path / "elsewhere"  # not the checkout: nothing imports from the source tree
    workdir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "wheel_smoke.py"), "demo",
                          "--starvewatch", str(target / "bin" / "starvewatch"), "--installed-in", str(target)],
                         cwd=workdir, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"wheel smoke: demo --quick from {target / 'starvewatch'}" in out.stdout
    assert "wheel smoke: a script's sidecar started the collector" in out.stdout


def test_the_smoke_refuses_a_package_imported_from_the_checkout(tmp_path):
    """The smoke's own guard: run against the source tree, it must fail, not pass vacuously."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, str(REPO / ".ci" / "wheel_smoke.py"), "demo",
                          "--starvewatch", "starvewatch"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert "source tree" in out.stderr


def test_the_sdist_carries_the_c_source_and_the_wheel_the_compiled_core(dist):
    """Issue 29: the compiled hot path is built by the normal install; its source ships in
    the sdist, so that `pip install` from an index builds it too; the wheel is platform-specific."""
    sdist, wheel = dist
    with tarfile.open(sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    assert {"setup.py", "starvewatch/_ccore.c"} <= names
    with zipfile.ZipFile(wheel) as zf:
        compiled = [n for n in zf.namelist() if n.startswith("starvewatch/_ccore") and n.endswith(".so")]
    assert len(compiled) == 1, compiled
    assert not wheel.name.endswith("-none-any.whl"), wheel.name  # a binary wheel, tagged for its platform


def test_a_build_without_a_c_compiler_installs_and_runs_the_python_core(dist, tmp_path):
    """CC=false: every compiler call fails. The install goes on without the extension and
    starvewatch imports, chooses the Python core and measures a loop."""
    sdist, _ = dist
    target = tmp_path / "site"
    env = dict(os.environ, CC="false", CXX="false", LDSHARED="false")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--no-build-isolation", "--no-cache-dir", "--target", str(target), str(sdist)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert list((target / "starvewatch").glob("_ccore*.so")) == []
    assert (target / "starvewatch" / "hooks" / "core.py").is_file()
    # A machine with only this install: an editable install of the checkout (as .ci/run makes)
    # leaves a finder on sys.meta_path that would resolve starvewatch._ccore to the checkout's
    # compiled module when the target has none.
    code = ("import sys\nsys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in str(getattr(f, '__module__', ''))]\n"
            "import starvewatch\nfrom starvewatch.hooks import core\nprint(starvewatch.__file__)\n"
            "print(core.current())\nstarvewatch.init('no-compiler')\n"
            "print(sum(1 for _ in starvewatch.watch(range(500))))\n"
            "print(starvewatch.finish(quiet=True)['loaders'][0]['steps'])\n")
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("STARVEWATCH_")}
    run_env.update(PYTHONPATH=str(target), STARVEWATCH_URL="off", STARVEWATCH_AUTOSTART="0",
                   STARVEWATCH_DIR=str(tmp_path / "sw"), STARVEWATCH_QUIET="1")
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=run_env, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    file, chosen, items, steps = ran.stdout.split()
    assert Path(file).parent == target / "starvewatch"
    assert (chosen, items, steps) == ("python", "500", "500")
