"""The documentation site: `mkdocs build --strict` of mkdocs.yml, offline, as CI builds it.

Strict turns every warning into a failure: a broken link or anchor, a page missing from the
navigation, a nav entry without its page. The API and schema pages are generated at build time
(docs/_hooks/reference.py), so they are checked against the code they come from.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 120


def _mkdocs(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # No network: any fetch through a proxy-aware client fails at once (a closed local port).
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(REPO),
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
    return subprocess.run([sys.executable, "-m", "mkdocs", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = _mkdocs(["build", "--strict", "--site-dir", str(out)], REPO)
    assert built.returncode == 0, built.stderr[-4000:]
    assert "WARNING" not in built.stderr, built.stderr[-4000:]
    return out


def _text(html_file: Path) -> str:
    """The visible text of a built page, tags stripped (enough for containment checks)."""
    html = html_file.read_text()
    main = html.split('<article', 1)[1].split('</article>', 1)[0] if '<article' in html else html
    text = re.sub(r"<[^>]+>", " ", main)
    return re.sub(r"\s+", " ", text.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
                  .replace("&quot;", '"').replace("&#39;", "'"))


def test_every_page_of_the_nav_is_built_and_uses_no_web_font(site):
    pages = ["index.html", "getting-started/index.html", "tutorial/index.html", "api/index.html",
             "troubleshooting/index.html", "what-it-measures/index.html",
             "dashboard/index.html", "diagnosis/index.html", "tuning/index.html", "loaders-supported/index.html",
             "fleets/index.html", "reliability/index.html", "security/index.html",
             "performance/index.html", "configuration/index.html", "reference/api/index.html",
             "reference/schemas/index.html", "design/index.html", "changelog/index.html"]
    for page in pages:
        assert (site / page).is_file(), page
        assert "fonts.googleapis.com" not in (site / page).read_text(), page  # theme.font: false
    # the screenshots the dashboard page shows are in the site
    for image in ("dashboard-run.png", "dashboard-compare.png"):
        assert (site / image).stat().st_size > 10_000
        assert f'src="../{image}"' in (site / "dashboard/index.html").read_text()
    for image in ("tutorial-runs.png", "tutorial-answer.png", "tutorial-compare.png"):
        assert (site / image).stat().st_size > 10_000
        assert f'src="../{image}"' in (site / "tutorial/index.html").read_text()
    # what is only a tool of the docs is not published
    assert not (site / "screenshots.py").exists() and not (site / "_hooks").exists()


def test_the_python_api_page_documents_every_public_function_and_argument(site):
    import inspect

    import starvewatch
    text = _text(site / "api/index.html")
    for name in ("watch", "init", "finish", "step", "phase", "tune"):
        function = getattr(starvewatch, name)
        doc = inspect.getdoc(function)
        assert "Example:" in doc and "Returns:" in doc, name
        assert f"starvewatch.{name}" in text, name
        for parameter in inspect.signature(function).parameters.values():
            shown = "**options" if parameter.kind is parameter.VAR_KEYWORD else parameter.name
            assert shown in doc.split("Args:", 1)[1].split("Returns:", 1)[0], f"{name}({parameter.name})"
    # the examples are rendered as code
    assert text.count("import starvewatch") >= 2


def test_user_pages_come_first_and_internals_last():
    import yaml
    nav = yaml.safe_load("nav:\n" + (REPO / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1])["nav"]
    titles = [next(iter(entry)) for entry in nav]
    assert titles[:3] == ["Home", "Getting started", "Your first 10 minutes"]
    internals = next(entry["Internals"] for entry in nav if "Internals" in entry)
    assert [next(iter(e.values())) for e in internals] == ["design.md", "performance.md"]
    assert titles.index("Internals") > titles.index("Reference") > titles.index("Troubleshooting")
    assert "/site/" in (REPO / ".gitignore").read_text().splitlines()


def test_every_http_route_is_described_with_an_example(site):
    from starvewatch.monitor.web.app import create_app
    from starvewatch.monitor.web.collector_settings import CollectorSettings
    document = create_app(CollectorSettings(dir=REPO / "does-not-matter")).openapi()
    for path, ops in document["paths"].items():
        for method, op in ops.items():
            assert "Example: `curl" in op.get("description", ""), f"{method.upper()} {path}"
    assert "Example: curl" in _text(site / "reference/api/index.html")


def test_the_api_page_is_the_openapi_document_of_this_code(site):
    from starvewatch.monitor.web.app import create_app
    from starvewatch.monitor.web.collector_settings import CollectorSettings
    document = create_app(CollectorSettings(dir=REPO / "does-not-matter")).openapi()
    text = _text(site / "reference/api/index.html")
    operations = [(method.upper(), path) for path, ops in document["paths"].items() for method in ops]
    assert len(operations) >= 15
    for method, path in operations:
        assert f"{method} {path}" in text, f"{method} {path} is not on the API page"
    for path, ops in document["paths"].items():
        for op in ops.values():
            for param in op.get("parameters", []):
                assert param["name"] in text
    import json
    served = json.loads((site / "reference/openapi.json").read_text())
    assert served == json.loads(json.dumps(document))


def test_the_schema_page_is_the_schema_module_and_the_wire_models(site):
    from starvewatch import schema
    from starvewatch.monitor.web.wire_models import EventBatch
    text = _text(site / "reference/schemas/index.html")
    assert schema.SUMMARY_SCHEMA in text and schema.EVENTS_SCHEMA in text
    html = (site / "reference/schemas/index.html").read_text()
    columns = re.findall(r'<td style="text-align: right;">(\d+)</td>\s*<td><code>(\w+)</code></td>', html)
    assert columns == [(str(i), name) for i, name in enumerate(schema.STEP_COLUMNS)]
    for field in EventBatch.model_json_schema(by_alias=True)["properties"]:
        assert field in text
    for model in ("EventBatch", "StepColumns", "RunInfo", "DeliveryAccount", "Stall"):
        assert f"{model}" in text
    assert f"at least {schema.MIN_STEPS_FOR_VERDICT} steps" in text


def test_the_changelog_page_is_the_changelog(site):
    changelog = (REPO / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert versions[0] == "Unreleased" and len(versions) >= 2
    text = _text(site / "changelog/index.html")
    for version in versions:
        assert version in text


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The strictness the site's test relies on: a link to a missing page aborts the build."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\n[gone](missing.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\ntheme:\n  name: material\n  font: false\n")
    built = _mkdocs(["build", "--strict", "--site-dir", str(tmp_path / "site")], tmp_path)
    assert built.returncode != 0
    assert "missing.md" in built.stderr


# ---- the README as a landing page -----------------------------------------------------------

def test_the_readme_is_a_landing_page_whose_links_all_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if "://" not in link]
    assert "docs/getting-started.md" in local and "LICENSE" in local
    assert [link for link in local if not (REPO / link).exists()] == []
    # the two commands of a fresh machine (the second under Development), one screenshot, and
    # overhead as a sentence that links the performance page, not its table
    assert "starvewatch demo" in readme and "bash .ci/run" in readme
    assert readme.index("## Quickstart") < readme.index("starvewatch demo") < readme.index("## Development") \
        < readme.index("bash .ci/run")
    assert len(re.findall(r"!\[[^\]]*\]\(", readme)) == 1
    assert "<!-- overhead:begin -->" not in readme and "docs/performance.md" in local
    # installed from a checkout into the user's environment: no torch pin, no PyPI name
    assert "torch==" not in readme and "pip install starvewatch" not in readme
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    # maintainer material lives in the docs
    for moved in ("_ccore.c", "STARVEWATCH_CORE", "(former README section)", "not met**"):
        assert moved not in readme
    # the tables that moved to the site are not in it any more
    for moved in ("<!-- scenarios:begin -->", "| fault | effect on training |", "| rule | advice | kind |",
                  "| variable | meaning |"):
        assert moved not in readme


@pytest.mark.parametrize("page, marker", [
    ("docs/diagnosis.md", "<!-- scenarios:begin -->"),            # benchmarks/scenarios/run.py writes it
    ("docs/diagnosis.md", "| rule | advice | kind |"),
    ("docs/tuning.md", "| dataset | sweep best |"),
    ("docs/reliability.md", "| fault | effect on training |"),
    ("docs/reliability.md", "| bound | when it is passed | reason |"),
    ("docs/configuration.md", "| variable | meaning |"),
    ("docs/loaders-supported.md", "| loader | how it is watched |"),
    ("docs/performance.md", "<!-- overhead:begin -->"),           # benchmarks/readme_table.py writes it
])
def test_the_tables_that_left_the_readme_are_on_the_site(page, marker):
    assert (REPO / page).read_text().count(marker) == 1
