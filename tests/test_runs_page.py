"""The runs page with 1,000 runs in a real store: grouped by name, filtered, a page at a time."""
import math

import pytest

from starvewatch.dashboard import callbacks, views
from starvewatch.monitor.storage.query import Query
from starvewatch.monitor.storage.store import Store
from tests.many_runs import seed_runs
from tests.test_dashboard_views import _text


def _rows(table) -> list:
    return table.children[1].children


@pytest.fixture(scope="module")
def thousand(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("many") / "db.sqlite")
    plans = seed_runs(store, 1000, groups=20)
    runs = Query(store).list_runs()
    yield plans, runs
    store.close()


def test_groups_by_name_newest_first_each_with_its_last_two(thousand):
    plans, runs = thousand
    assert len(runs) == 1000
    groups = views.group_runs(runs)
    # Run 999 is job-19, 998 job-18...: the groups in the order of their newest run.
    assert [g["name"] for g in groups] == [f"job-{i}" for i in range(19, -1, -1)]
    for g in groups:
        mine = [p["id"] for p in plans if p["name"] == g["name"]]
        assert [r["id"] for r in g["runs"]] == mine[::-1] and g["total"] == 50
        assert g["last_two"] == [mine[-2], mine[-1]]
    by_name = views.group_runs(runs, sort="name")
    assert [g["name"] for g in by_name] == sorted(f"job-{i}" for i in range(20))
    by_wait = views.group_runs(runs, sort="wait")
    newest_wait = [g["runs"][0]["input_wait_fraction"] or 0 for g in by_wait]
    assert newest_wait == sorted(newest_wait, reverse=True) and newest_wait[0] > newest_wait[-1]


def test_filters_by_status_and_verdict(thousand):
    plans, runs = thousand
    ids = lambda groups: {r["id"] for g in groups for r in g["runs"]}  # noqa: E731
    assert ids(views.group_runs(runs, status="live")) == {p["id"] for p in plans if p["live"]}
    assert ids(views.group_runs(runs, status="finished")) == {p["id"] for p in plans if not p["live"]}
    assert ids(views.group_runs(runs, verdict="insufficient_data")) == {p["id"] for p in plans if p["steps"] < 20}
    # No wait at all (i % 7 == 0) with enough steps: not input-bound.
    assert ids(views.group_runs(runs, verdict="not")) == {p["id"] for p in plans
                                                          if p["wait_ms"] == 0 and p["steps"] == 20}
    both = views.group_runs(runs, status="finished", verdict="high")
    assert both and all(r["status"] == "finished" and r["verdict"] == "high" for g in both for r in g["runs"])
    # A filtered group still offers its last two runs, and says how many of its runs match.
    live = views.runs_view(runs, status="live")
    assert live["runs"] == 200 and live["groups"] == 4  # i % 5 == 0: job-0, job-5, job-10, job-15
    calm = views.runs_view(runs, verdict="not")
    header = _text(_rows(calm["table"])[0])
    newest = max((p for p in plans if p["wait_ms"] == 0 and p["steps"] == 20), key=lambda p: p["started_s"])
    matching = sum(p["name"] == newest["name"] and p["wait_ms"] == 0 and p["steps"] == 20 for p in plans)
    assert header.startswith(newest["name"]) and f"{matching} of 50 runs match" in header and matching < 50
    assert "compare the last two" in header
    # Every fifth run is live (even i) and every tenth too short (odd i): no run is both.
    none = views.runs_view(runs, status="live", verdict="insufficient_data")
    assert none["table"].id == "runs-none" and none["runs"] == 0


def test_pages_of_runs_with_groups_headed_again_when_cut(thousand):
    plans, runs = thousand
    first = views.runs_view(runs)
    # 20 groups x their 3 newest runs = 60 runs: two pages of 50.
    assert (first["pages"], first["shown"], first["groups"], first["runs"]) == (2, 60, 20, 1000)
    rows = _rows(first["table"])
    assert sum(r.className == "sw-run" for r in rows) == views.PAGE_SIZE
    assert sum(r.className == "sw-group" for r in rows) == math.ceil(views.PAGE_SIZE / views.PER_GROUP)
    second = views.runs_view(runs, page=1)
    rows = _rows(second["table"])
    assert sum(r.className == "sw-run" for r in rows) == 10
    # 50 = 16 groups x 3 + 2 runs of the 17th: it is headed again, marked continued.
    assert "(continued)" in _text(rows[0]) and "job-3" in _text(rows[0])
    assert views.runs_view(runs, page=99)["page"] == 1  # past the end: the last page
    assert views.runs_view(runs, page=-3)["page"] == 0
    # A group's own page shows every run of it, newest first, with nothing else.
    group = views.runs_view(runs, group="job-7")
    names = {p["id"] for p in plans if p["name"] == "job-7"}
    shown = [r.children[0].children.children for r in _rows(group["table"]) if r.className == "sw-run"]
    assert set(shown) == names and len(shown) == 50 and group["pages"] == 1 and group["groups"] == 1
    assert shown == sorted(shown, reverse=True)


def test_group_header_links_its_newest_run_all_runs_and_the_last_two(thousand):
    _, runs = thousand
    header = _rows(views.runs_view(runs)["table"])[0]
    name_link, _, _, all_link = header.children[0].children
    assert name_link.children == "job-19" and name_link.href == "/runs/run-0999"
    assert all_link.href == "/groups/job-19" and all_link.children == "all 50"
    compare_link = header.children[1].children
    assert compare_link.children == "compare the last two" and compare_link.href == "/compare?a=run-0979&b=run-0999"


def test_pager_and_filters_move_the_page_and_an_unchanged_list_is_not_redrawn(thousand):
    _, runs = thousand
    assert callbacks.page_after({"runs-next"}, 0) == 1 and callbacks.page_after({"runs-prev"}, 0) == 0
    assert callbacks.page_after({"runs-prev"}, 3) == 2 and callbacks.page_after({"tick"}, 3) == 3
    # A tick and a click in one request: the click counts.
    assert callbacks.page_after({"tick", "runs-prev"}, 3) == 2 and callbacks.page_after({"runs-next", "tick"}, 3) == 4
    for trigger in ("runs-search", "runs-sort", "runs-status", "runs-verdict"):
        assert callbacks.page_after({trigger}, 4) == 0 and callbacks.page_after({trigger, "runs-next"}, 4) == 0
    assert callbacks.page_after({"runs-next"}, "x") == 1 and callbacks.page_after(None, True) == 0  # any JSON
    table, info, prev_off, next_off, page, digest = callbacks.runs_outputs(runs, None, "started", "", "", 5, None)
    assert (page, prev_off, next_off) == (1, False, True) and "page 2 of 2" in info and "1,000 runs in 20 groups" in info
    assert callbacks.runs_outputs(runs, None, "started", "", "", 1, digest) == (callbacks.no_update,) * 6
    assert callbacks.runs_outputs(runs, None, "started", "lost", "", 1, digest)[0].id == "runs-none"


def test_route_reads_the_group():
    page = callbacks.route("/groups/job%201%2Fx", "")
    assert page.children[1].data == "job 1/x" and "Runs named" in _text(page.children[0])
    assert callbacks.route("/", "").children[1].data is None


def test_listing_figures_equal_the_summary(tmp_path):
    """The runs list computes verdict, input wait, batches/s and steps from the totals alone:
    the same values as the run's summary, for one rank, two ranks and two loaders."""
    import orjson

    from starvewatch.monitor.web.wire_models import EventBatch
    from tests.test_collector_api import batch
    store = Store(tmp_path / "db.sqlite")
    seed_runs(store, 30, groups=3)
    for rank in (0, 1):  # two ranks of one run, the second slower
        store.ingest(EventBatch.model_validate_json(orjson.dumps(
            batch(run_id="ranked", stream=f"r{rank}", rank=rank, wait_ns=(rank + 1) * 3_000_000))))
    two = batch(run_id="two-loaders", stream="t", n=50)
    two["loaders"].append({"name": "val", "totals": {"steps": 5, "epochs": 1, "wait_ns": 5 * 9_000_000,
                                                     "compute_ns": 5_000_000}})
    store.ingest(EventBatch.model_validate_json(orjson.dumps(two)))
    query = Query(store)
    listed = {r["id"]: r for r in query.list_runs()}
    assert len(listed) == 32
    for run_id, r in listed.items():
        s = query.summary(run_id)
        assert r["verdict"] == s["verdict"]["input_bound"], run_id
        assert r["input_wait_fraction"] == pytest.approx(s["verdict"]["input_wait_fraction"]), run_id
        # The training loader's throughput, never another loader's added to it.
        assert r["batches_per_s"] == pytest.approx(s["verdict"]["batches_per_s"]), run_id
        assert r["training_loader"] == s["verdict"]["training_loader"], run_id
        assert r["steps"] == sum(l["steps"] for l in s["loaders"])
    assert listed["ranked"]["ranks"] == 2 and listed["two-loaders"]["steps"] == 55
    assert {r["verdict"] for r in listed.values()} >= {"high", "not", "insufficient_data"}
    store.close()


def test_the_runs_version_follows_the_listed_figures(thousand):
    _, runs = thousand
    copy = [dict(r) for r in runs]
    assert callbacks.runs_version(runs) == callbacks.runs_version(copy)
    changed = [dict(r, status="lost") if i == 500 else r for i, r in enumerate(runs)]  # a new answer, a new list
    assert callbacks.runs_version(changed) != callbacks.runs_version(runs)
