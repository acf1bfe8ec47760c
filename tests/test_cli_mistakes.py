"""A user's mistakes through the real entry point (`python -m starvewatch`): each gets a
message and an exit code, never a traceback; deleting asks first."""
import os
import pty
import socket
import subprocess
import sys

from tests.conftest import free_port
from tests.test_cli import cli, offline_runs  # noqa: F401  (a fixture, used by name)


def no_traceback(out):
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout, out.stderr


def test_export_into_a_missing_folder_says_so(offline_runs, tmp_path):  # noqa: F811
    out = cli("export", "latest", "-f", "csv", "-o", str(tmp_path / "no" / "such" / "steps.csv"))
    assert out.returncode == 1 and "cannot write" in out.stderr and "No such file or directory" in out.stderr
    no_traceback(out)


def test_an_unknown_run_is_named(offline_runs):  # noqa: F811
    for args in (("export", "no-such-run"), ("runs", "show", "no-such-run"), ("compare", "latest", "nope")):
        out = cli(*args)
        assert out.returncode == 1 and "unknown run" in out.stderr and "`starvewatch runs` lists" in out.stderr
        no_traceback(out)


def test_offline_reads_say_they_are_offline(offline_runs):  # noqa: F811
    out = cli("runs")
    assert out.returncode == 0 and "no collector answers; reading offline data" in out.stderr


def test_a_closed_pipe_ends_quietly(offline_runs):  # noqa: F811
    # The reading end is closed before the command starts: its first write meets a closed pipe,
    # as `starvewatch runs | head -1` does once head has exited.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "starvewatch", "runs"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_an_unknown_flag_shows_the_subcommands_usage():
    out = cli("runs", "--bogus")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: starvewatch runs ") and "unrecognized arguments: --bogus" in out.stderr
    out = cli("export", "latest", "--fromat", "csv")
    assert out.returncode == 2 and out.stderr.startswith("usage: starvewatch export ")


def test_a_typo_gets_the_close_command():
    out = cli("sevre")
    assert out.returncode == 2 and "did you mean 'serve'?" in out.stderr
    out = cli("runs", "shwo", "latest")
    assert out.returncode == 2 and "did you mean 'show'?" in out.stderr
    out = cli("xyzzy")
    assert out.returncode == 2 and "did you mean" not in out.stderr  # nothing close: no guess


def test_no_runs_of_a_status_is_said(offline_runs):  # noqa: F811
    out = cli("runs", "--status", "live")
    assert out.returncode == 0 and out.stdout.startswith("no live runs in offline data")
    out = cli("runs", "--search", "zzz")
    assert out.returncode == 0 and out.stdout.startswith("no runs matching 'zzz' in")


def test_delete_asks_first(collector, monkeypatch):
    import starvewatch
    c = collector()
    monkeypatch.setenv("STARVEWATCH_URL", c.url)
    list(starvewatch.watch(range(20)))
    run_id = starvewatch.finish()["run"]["id"]

    def held():
        return [r["id"] for r in c.get("/api/v1/runs")["runs"]]

    # No terminal to ask on (a script, a pipe): refused, nothing deleted.
    out = cli("runs", "delete", run_id)
    assert out.returncode == 2 and "without confirmation" in out.stderr and "--yes" in out.stderr
    assert held() == [run_id]

    def on_a_terminal(reply: str):
        parent, child = pty.openpty()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "starvewatch", "runs", "delete", run_id],
                                    stdin=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            os.write(parent, reply.encode() + b"\n")  # typed ahead: the terminal keeps it
            out, err = proc.communicate(timeout=120)
        finally:
            os.close(parent)
            os.close(child)
        return proc.returncode, out, err

    code, out, err = on_a_terminal("n")
    assert code == 1 and f"delete run {run_id} (name " in err and "[y/N]" in err and "nothing deleted" in err
    assert held() == [run_id]
    code, out, err = on_a_terminal("y")
    assert code == 0 and f"deleted run {run_id}" in out, err
    assert held() == []

    list(starvewatch.watch(range(20)))
    run_id = starvewatch.finish()["run"]["id"]
    out = cli("runs", "delete", run_id, "--yes")
    assert out.returncode == 0 and f"deleted run {run_id}" in out.stdout
    assert held() == []


def test_serve_on_a_port_in_use_names_who_holds_it(collector, isolated_starvewatch):
    c = collector()
    ours = cli("serve", "--port", str(c.port), "--dir", str(isolated_starvewatch))
    assert ours.returncode == 1
    assert (f"a starvewatch collector already runs on {c.url} (pid {c.proc.pid})" in ours.stderr
            and f"`starvewatch stop --dir {isolated_starvewatch}`" in ours.stderr), ours.stderr
    # Ours too, from another data directory: found by asking it.
    elsewhere = cli("serve", "--port", str(c.port), "--dir", str(isolated_starvewatch / "other"))
    assert elsewhere.returncode == 1 and "a starvewatch collector already answers" in elsewhere.stderr

    port = free_port()
    with socket.create_server(("127.0.0.1", port)):  # another program's port
        foreign = cli("serve", "--port", str(port))
    assert foreign.returncode == 1
    assert f"port {port} is in use by another program" in foreign.stderr and f"--port {port + 1}" in foreign.stderr
    no_traceback(foreign)
