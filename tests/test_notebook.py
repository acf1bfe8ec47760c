"""Notebooks, driven through a real Jupyter kernel (nbclient + ipykernel): one kernel and one
real collector for the module; each test runs its cells and reads what the user would see
(the cells' outputs) and what the collector stored."""
from __future__ import annotations

import json
import os
import re
import textwrap
import urllib.parse
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import Collector, wait_until

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "nb-secret-token-5e1f"


class Kernel:
    """A real ipykernel run by nbclient; `run(code)` executes one cell and returns it."""

    def __init__(self, env: dict, cwd: Path) -> None:
        self.nb = nbformat.v4.new_notebook()
        self.client = NotebookClient(self.nb, timeout=120, allow_errors=True, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
        self.client.km = self.client.create_kernel_manager()
        self.client.start_new_kernel(env=env)
        self.client.start_new_kernel_client()

    def run(self, code: str, cell_id: str | None = None):
        """`cell_id`: sent as JupyterLab, Notebook 7 and VS Code do (execute_request metadata)."""
        cell = nbformat.v4.new_code_cell(textwrap.dedent(code))
        self.nb.cells.append(cell)
        session = self.client.kc.session
        if cell_id is not None:
            original = session.msg

            def with_cell_id(msg_type, content=None, parent=None, header=None, metadata=None):
                if msg_type == "execute_request":
                    metadata = dict(metadata or {}, cellId=cell_id)
                return original(msg_type, content, parent, header, metadata)
            session.msg = with_cell_id
        try:
            self.client.execute_cell(cell, len(self.nb.cells) - 1)
        finally:
            session.__dict__.pop("msg", None)
        return cell

    def value(self, code: str, cell_id: str | None = None):
        """Run a cell whose last stdout line is JSON; fail with the cell's errors if it has any."""
        cell = self.run(code, cell_id)
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, "\n".join(errors[0].traceback)
        text = "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
        return json.loads(text.strip().splitlines()[-1])

    def close(self) -> None:
        self.client._cleanup_kernel()  # nbclient's own: stops the channels, shuts the kernel down


def frame_and_link(shown: str) -> tuple[str, str]:
    """The inline output's IFrame source and its link's address."""
    return (re.search(r'<iframe id="[^"]+" src="([^"]+)"', shown).group(1),
            re.search(r'<a href="([^"]+)"', shown).group(1))


def all_output_text(cell) -> str:
    return json.dumps(cell.outputs)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("nb-collector")
    collector = Collector(directory, token=TOKEN).start()
    yield collector
    collector.stop()


@pytest.fixture(scope="module")
def kernel(served, tmp_path_factory):
    work = tmp_path_factory.mktemp("nb-kernel")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STARVEWATCH_", "JPY_", "MASTER_"))}
    env.update(PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep),
               STARVEWATCH_DIR=str(work / "sw"), STARVEWATCH_URL=served.url, STARVEWATCH_TOKEN=TOKEN,
               STARVEWATCH_AUTOSTART="0", JUPYTER_PLATFORM_DIRS="1", PYTHONWARNINGS="ignore")
    k = Kernel(env, work)
    k.value("""
        import json, os, sys, time
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import starvewatch as sw
        from starvewatch.hooks import session as sw_session

        class Slow:
            '''Each batch takes `wait_s` to arrive; WAITED holds the waits as this loader saw them.'''
            def __init__(self, wait_s):
                self.wait_s = wait_s
            def __iter__(self):
                while True:
                    t0 = time.perf_counter()
                    time.sleep(self.wait_s)
                    WAITED.append(time.perf_counter() - t0)
                    yield torch.zeros(4, 2)

        def run_info():
            s = sw_session.current_session()
            return {"id": s.run_id, "name": s.name, "active": s.active}
        print(json.dumps(sw.__file__))
    """)
    yield k
    # Whatever the tests showed, the token never reached a cell's output (outputs are saved
    # into the .ipynb).
    assert TOKEN not in json.dumps([c.outputs for c in k.nb.cells])
    k.close()


def runs_named(served, name: str) -> list[dict]:
    body = served.get("/api/v1/runs?" + urllib.parse.urlencode({"search": name}))
    return sorted((r for r in body["runs"] if r["name"] == name), key=lambda r: r["started_at"])


def stored_summary(served, run_id: str) -> dict:
    return served.get(f"/api/v1/runs/{urllib.parse.quote(run_id)}/summary")


def test_the_package_in_the_kernel_is_this_tree(kernel):
    assert kernel.value("print(json.dumps(sw.__file__))").startswith(str(ROOT))


def test_run_named_after_the_notebook(kernel, served):
    names = kernel.value("""
        names = []
        os.environ["JPY_SESSION_NAME"] = "/home/me/work/cifar baseline.ipynb"  # Jupyter server 2
        list(sw.watch([1, 2, 3], "x")); names.append(sw.finish()["run"]["name"])
        del os.environ["JPY_SESSION_NAME"]
        __vsc_ipynb_file__ = r"c:\\Users\\me\\nb\\tuning.ipynb"  # VS Code, in the user namespace
        list(sw.watch([1, 2, 3], "x")); names.append(sw.finish()["run"]["name"])
        del __vsc_ipynb_file__
        list(sw.watch([1, 2, 3], "x")); names.append(sw.finish()["run"]["name"])
        print(json.dumps(names))
    """)
    assert names == ["cifar baseline", "tuning", "notebook"]
    for name in names:  # as the collector stored them
        wait_until(lambda: runs_named(served, name), what=f"run {name!r} stored")


def test_interrupted_loop_does_not_count_the_time_until_the_next_cell(kernel, served):
    kernel.run("""
        os.environ["JPY_SESSION_NAME"] = "interrupted.ipynb"
        WAITED = []
        loader = sw.watch(Slow(0.03), "train")  # (the run starts here: not part of the loop)
        t_start = time.perf_counter()
        for i, batch in enumerate(loader):
            time.sleep(0.01)  # the model's step
            if i == 24:
                LOOP_S = time.perf_counter() - t_start
                raise KeyboardInterrupt  # as Ctrl-C / "interrupt the kernel" does
    """)
    assert kernel.nb.cells[-1].outputs[-1]["ename"] == "KeyboardInterrupt"
    idle = kernel.run("time.sleep(1.5)  # the user reads, then runs another cell")
    assert not [o for o in idle.outputs if o.output_type == "error"]
    got = kernel.value("""
        s = sw.finish()
        print(json.dumps({"wait": s["verdict"]["input_wait_fraction"], "id": s["run"]["id"],
                          "verdict": s["verdict"]["input_bound"],
                          "steps": s["loaders"][0]["steps"], "truth": sum(WAITED) / LOOP_S}))
    """)
    # The loop's own clock: ~75% waiting. Counting the idle 1.5 s as compute gives ~40%.
    assert got["truth"] > 0.6
    assert got["steps"] == 25 and got["verdict"] == "high"
    assert abs(got["wait"] - got["truth"]) < 0.03, got
    stored = wait_until(lambda: (stored_summary(served, got["id"])["verdict"]["input_wait_fraction"]
                                 if runs_named(served, "interrupted")
                                 and runs_named(served, "interrupted")[-1]["status"] == "finished" else None),
                        what="the interrupted run stored")
    assert abs(stored - got["truth"]) < 0.03, (stored, got)


def test_next_calls_spread_over_cells_count_no_idle_time(kernel):
    kernel.run("""
        WAITED = []
        it = iter(sw.watch(Slow(0.02), "spread"))
        batch = next(it)
        t_compute = time.perf_counter()
        time.sleep(0.05)  # some work on the batch in this cell
        COMPUTE_S = [time.perf_counter() - t_compute]
    """)
    kernel.run("time.sleep(1.0)  # between cells")
    kernel.run("""
        batch = next(it)
        t_compute = time.perf_counter()
        time.sleep(0.05)
        COMPUTE_S.append(time.perf_counter() - t_compute)
        batch = next(it)
    """)
    kernel.run("time.sleep(1.0)")
    got = kernel.value("""
        s = sw.finish()
        loader = [l for l in s["loaders"] if l["name"] == "spread"][0]
        print(json.dumps({"compute_max_ms": loader["compute_ms"]["max"], "steps": loader["steps"],
                          "truth_ms": 1000 * max(COMPUTE_S)}))
    """)
    assert got["steps"] == 3
    # Each step's compute is its cell's work (~50 ms), never the second between cells.
    assert got["truth_ms"] <= got["compute_max_ms"] < got["truth_ms"] + 150, got


def test_rewatch_with_other_settings_starts_a_new_run_of_the_same_name(kernel, served):
    cell = """
        os.environ["JPY_SESSION_NAME"] = "rewatch.ipynb"
        ds = TensorDataset(torch.arange(64.0))
        train = sw.watch(DataLoader(ds, batch_size={bs}))
        for batch in train:
            pass
        INFO = run_info()
        print(json.dumps(dict(INFO, loaders=[l.name for l in sw_session.current_session().loader_list])))
    """
    first = kernel.value(cell.format(bs=8))
    assert first["loaders"] == ["train"]
    second = kernel.value(cell.format(bs=16))  # the cell re-run with another batch size
    assert second["name"] == first["name"] == "rewatch"
    assert second["id"] != first["id"]
    assert second["loaders"] == ["train"]  # the earlier name, not loader2
    third = kernel.value(cell.format(bs=16))  # the same settings again: the same run goes on
    assert third["id"] == second["id"] and third["loaders"] == ["train"]
    kernel.value("sw.finish(); print(1)")
    runs = wait_until(lambda: [r for r in runs_named(served, "rewatch") if r["status"] == "finished"][1:] and
                      runs_named(served, "rewatch"), what="both runs finished")
    assert [r["id"] for r in runs] == [first["id"], second["id"]]
    one, two = (stored_summary(served, r["id"])["loaders"] for r in runs)
    assert [(l["name"], l["config"]["batch_size"], l["steps"], l["epochs"]) for l in one] == [("train", 8, 8, 1)]
    assert [(l["name"], l["config"]["batch_size"], l["steps"], l["epochs"]) for l in two] == [("train", 16, 8, 2)]


def test_unnamed_rewatch_in_a_rerun_cell_keeps_its_names_by_cell_id(kernel, served):
    """Two unnamed loaders made in one cell (no variable to tell them apart): the cell's id and
    each call's rank in it keep their names when the cell is re-run with other settings."""
    cell = """
        os.environ["JPY_SESSION_NAME"] = "cellid.ipynb"
        ds = TensorDataset(torch.arange(32.0))
        LOADERS = []
        for b in {sizes}:
            LOADERS.append(sw.watch(DataLoader(ds, batch_size={size}))) # no variable names them
        for loader in LOADERS:
            for batch in loader:
                pass
        s = sw_session.current_session()
        print(json.dumps(dict(run_info(), loaders=[[l.name, l.config["batch_size"]] for l in s.loader_list])))
    """
    first = kernel.value(cell.format(sizes=(8, 4), size="b"), cell_id="cell-a")
    assert first["loaders"] == [["train", 8], ["TensorDataset", 4]]  # its dataset's class
    other = kernel.value('val = [sw.watch([1, 2]) for _ in range(1)][0]; list(val); '
                         'print(json.dumps(sw_session.current_session().loader_list[-1].name))', cell_id="cell-b")
    assert other == "loader"  # another cell: another name (a list: nothing to name it by)
    # The cell edited (the watch line too) and re-run.
    second = kernel.value(cell.format(sizes=(8, 2), size="b * 2"), cell_id="cell-a")
    assert second["id"] != first["id"] and second["name"] == "cellid"
    assert second["loaders"] == [["train", 16], ["TensorDataset", 4]]  # not TensorDataset-2, -3
    kernel.value("sw.finish(); print(1)")


def test_unnamed_rewatch_on_a_line_that_assigns_nothing(kernel):
    cell = """
        os.environ["JPY_SESSION_NAME"] = "lines.ipynb"
        for batch in sw.watch(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)):
            pass
        print(json.dumps([l.name for l in sw_session.current_session().loader_list]))
    """
    kernel.value("sw.finish(); print(1)")
    assert kernel.value(cell) == ["train"]
    assert kernel.value(cell) == ["train"]  # run again: the same loader, not a second one
    kernel.value("sw.finish(); print(1)")


def test_inline_live_page_and_html_summary(kernel, served):
    kernel.run("""
        os.environ["JPY_SESSION_NAME"] = "inline.ipynb"
        loader = sw.watch([torch.zeros(2)] * 5, "train")
    """)
    first = kernel.nb.cells[-1]
    run = kernel.value("print(json.dumps(run_info()))")
    html_outputs = [o for o in first.outputs if o.output_type == "display_data"]
    assert len(html_outputs) == 1
    page = f"{served.url}/runs/{run['id']}"
    shown = html_outputs[0]["data"]["text/html"]
    assert frame_and_link(shown) == (page, page)
    # The page the frame shows exists (the collector answers it to a browser that has the token).
    status, _ = served.request("GET", urllib.parse.urlsplit(page).path)
    assert status == 200
    again = kernel.run('val = sw.watch([1, 2], "val")')  # a second watch of the run: nothing more
    assert [o for o in again.outputs if o.output_type == "display_data"] == []
    done = kernel.run("for b in loader: pass\nsw.finish()")
    # Shown once: by finish() itself; the cell's value adds nothing.
    shown = [o for o in done.outputs if o.output_type in ("execute_result", "display_data") and o.get("data")]
    assert len(shown) == 1, done.outputs
    report = shown[0]["data"]["text/html"]
    # The headline in the one vocabulary: a loop this short is not enough data yet.
    assert "inline" in report and run["id"] in report and "Not enough data yet" in report
    assert kernel.value("s = sw.finish(); print(json.dumps([isinstance(s, dict), json.loads(json.dumps(s))"
                        "['run']['id']]))") == [True, run["id"]]
    assert TOKEN not in all_output_text(first) + all_output_text(done)


def test_colab_port_proxy_with_a_stand_in_module(kernel, served, tmp_path):
    fake = tmp_path / "fake_colab"
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "colab" / "__init__.py").write_text("")
    (fake / "google" / "colab" / "output.py").write_text(textwrap.dedent("""
        ASKED = []
        def eval_js(script, ignore_result=False, timeout_sec=None):
            ASKED.append(script)  # the frontend answers with the proxied URL of the port
            return "https://8412-m-s-test.colab.googleusercontent.com/"
    """))
    cell = kernel.run(f"""
        sys.path.insert(0, {str(fake)!r})
        import google.colab, google.colab.output
        sw.finish()
        loader = sw.watch([1, 2, 3], "train")
    """)
    asked = kernel.value("""
        print(json.dumps([google.colab.output.ASKED, run_info()["id"], os.environ.pop("STARVEWATCH_FRAME_ANCESTORS")]))
        sw.finish()
        for m in [m for m in sys.modules if m.startswith("google.colab")]:
            del sys.modules[m]
        sys.path.pop(0)
    """)
    scripts, run_id, ancestors = asked
    # A collector started from this kernel lets Colab's output frames show run pages.
    assert ancestors == "https://colab.research.google.com https://*.googleusercontent.com"
    port = urllib.parse.urlsplit(served.url).port
    assert scripts == [f"google.colab.kernel.proxyPort({port}, {{'cache': false}})"]
    shown = [o for o in cell.outputs if o.output_type == "display_data"][0]["data"]["text/html"]
    proxied = f"https://8412-m-s-test.colab.googleusercontent.com/runs/{run_id}"
    assert frame_and_link(shown) == (proxied, proxied)


def test_jupyterhub_proxy_template(kernel, served):
    cell = kernel.run("""
        os.environ["STARVEWATCH_PROXY_URL"] = "/user/alice/proxy/%PORT%/"
        sw.finish()
        loader = sw.watch([1, 2, 3], "train")
    """)
    run_id = kernel.value("""
        print(json.dumps(run_info()["id"]))
        sw.finish()
        del os.environ["STARVEWATCH_PROXY_URL"]
    """)
    port = urllib.parse.urlsplit(served.url).port
    shown = [o for o in cell.outputs if o.output_type == "display_data"][0]["data"]["text/html"]
    proxied = f"/user/alice/proxy/{port}/runs/{run_id}"
    assert frame_and_link(shown) == (proxied, proxied)


def test_idle_run_ends_and_a_later_watch_starts_a_new_one(kernel, served):
    first = kernel.value("""
        os.environ["JPY_SESSION_NAME"] = "idle.ipynb"
        os.environ["STARVEWATCH_NOTEBOOK_IDLE_S"] = "1"
        sw.finish()
        for batch in sw.watch([1, 2, 3], "train"):
            pass
        time.sleep(2.5)  # a cell that runs longer than the idle time: never ended under it
        print(json.dumps(run_info()))
    """)
    assert first["active"] is True
    # No cell runs now: the run ends on its own, as the collector sees it.
    wait_until(lambda: [r for r in runs_named(served, "idle") if r["id"] == first["id"]
                        and r["status"] == "finished"], what="the idle run finished")
    second = kernel.value("""
        OLD = sw.watch([1, 2, 3], "train")
        for batch in OLD:
            pass
        print(json.dumps(run_info()))
    """)
    assert second["active"] is True and second["name"] == "idle" and second["id"] != first["id"]
    wait_until(lambda: [r for r in runs_named(served, "idle") if r["id"] == second["id"]
                        and r["status"] == "finished"], what="the second run's idle end")
    # A loader of an ended run, iterated again without watch(): a new run, which ends alike.
    third = kernel.value("""
        for batch in OLD:
            pass
        print(json.dumps(run_info()))
        del os.environ["STARVEWATCH_NOTEBOOK_IDLE_S"]
    """)
    assert third["active"] is True and third["name"] == "idle" and third["id"] not in (first["id"], second["id"])
    wait_until(lambda: [r for r in runs_named(served, "idle") if r["id"] == third["id"]
                        and r["status"] == "finished"], what="the third run's idle end")
    runs = runs_named(served, "idle")
    assert [r["id"] for r in runs] == [first["id"], second["id"], third["id"]]
    steps = [stored_summary(served, r["id"])["loaders"][0]["steps"] for r in runs]
    assert steps == [3, 3, 3]


def test_finish_shows_its_summary_whatever_the_cell_does_with_it(kernel, served):
    """`summary = finish()` (no cell value) shows the summary once, with the expected speed-up
    and the line to copy; nothing informational is written to stderr (drawn red as an error);
    the summary variable alone in a later cell shows it again."""
    kernel.run("""
        sw.finish()  # whatever run an earlier test left
        sw.init("assigned")
        WAITED = []
        from torch.utils.data import Dataset
        class SlowSet(Dataset):
            def __len__(self):
                return 160
            def __getitem__(self, i):
                time.sleep(0.004)
                return torch.zeros(2)
        for batch in sw.watch(DataLoader(SlowSet(), batch_size=4, num_workers=0), "train"):
            time.sleep(0.004)
    """)
    done = kernel.run("summary = sw.finish()")
    assert not [o for o in done.outputs if o.output_type == "error"], done.outputs
    shown = [o for o in done.outputs if o.output_type in ("execute_result", "display_data")]
    assert len(shown) == 1, done.outputs
    report, text = shown[0]["data"]["text/html"], shown[0]["data"]["text/plain"]
    assert "assigned" in report and "waited for data" in report
    assert re.search(r"expected [\d.]+x(–[\d.]+x)? faster", report), report
    assert re.search(r"<pre class='starvewatch-snippet'>DataLoader\(dataset, [^<]*num_workers=\d", report), report
    assert text.startswith("starvewatch: run assigned")
    everything = kernel.nb.cells[-2].outputs + done.outputs
    assert [o for o in everything if o.output_type == "stream" and o.name == "stderr"] == [], everything
    later = kernel.run("summary")
    again = [o for o in later.outputs if o.output_type in ("execute_result", "display_data") and o.get("data")]
    assert len(again) == 1 and "assigned" in again[0]["data"]["text/html"]
