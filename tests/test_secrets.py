"""Secrets stay secret (issue 27, item 5): redaction by pattern family, a login cookie that is
not the token and belongs to one port, a token never needed on the command line, strong tokens
off loopback, slowed guessing, owner-only files. Real collectors on free ports."""
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

import starvewatch
from starvewatch.redact import redact_argv
from tests.conftest import Collector, free_port, wait_until
from tests.test_security import call

TOKEN = "secrets-token-0123456789abcdef"

# (argument list, what is stored): one row per way a secret travels on a command line.
REDACTION_TABLE = [
    (["--private-key", "k1"], ["--private-key", "***"]),
    (["--wandb-key", "k2"], ["--wandb-key", "***"]),
    (["--pass", "k3"], ["--pass", "***"]),
    (["-p", "k4"], ["-p", "***"]),
    (["--pwd", "k5"], ["--pwd", "***"]),
    (["--pw", "k5b"], ["--pw", "***"]),
    (["--passphrase", "k6"], ["--passphrase", "***"]),
    (["--access-key", "k7"], ["--access-key", "***"]),
    (["--session-cookie", "k8"], ["--session-cookie", "***"]),
    (["--signing-key=k9"], ["--signing-key=***"]),
    (["--request-signature", "k9b"], ["--request-signature", "***"]),
    (["HF_TOKEN=k10"], ["HF_TOKEN=***"]),
    (["db.password=k11"], ["db.password=***"]),
    (["--hf-token", "k12"], ["--hf-token", "***"]),
    (["--api_key=k13"], ["--api_key=***"]),
    (["--wandbApiKey", "k14"], ["--wandbApiKey", "***"]),
    (["--client-secret", "k15"], ["--client-secret", "***"]),
    (["--credentials", "k16"], ["--credentials", "***"]),
    (["--auth", "k17"], ["--auth", "***"]),
    (["--bearer", "k18"], ["--bearer", "***"]),
    (["--data", "https://user:k19@example.com/x"], ["--data", "https://***@example.com/x"]),
    (["s3://AKIAK20@bucket/key"], ["s3://***@bucket/key"]),
    (["--url", "https://h/x?token=k21&page=2"], ["--url", "https://h/x?token=***&page=2"]),
    (["-H", "Authorization: Bearer k22"], ["-H", "Authorization: Bearer ***"]),
    # Issue 36's probe: each of these was stored as sent.
    (["--data", "https://a.blob.core.windows.net/c/x?sv=2022-11-02&se=2026&sp=r&sig=k23%3D"],
     ["--data", "https://a.blob.core.windows.net/c/x?sv=2022-11-02&se=2026&sp=r&sig=***"]),
    (["-pk24secret"], ["-p***"]),
    (["--callback", "https://h/cb#access_token=k25&state=1"], ["--callback", "https://h/cb#access_token=***&state=1"]),
    (["-H", "X-Api-Key: k26"], ["-H", "X-Api-Key: ***"]),
    (["--dsn", "host=db user=me password=k27 dbname=x"], ["--dsn", "host=db user=me password=*** dbname=x"]),
    (["--model", "hf_k28abcdefghijklmnopqrstuvwxyz"], ["--model", "***"]),
    (["--llm", "sk-k29abcdefghijklmnopqrstuvwxyz0123"], ["--llm", "***"]),
    (["--repo", "ghp_k30abcdefghijklmnopqrstuvwxyz0123"], ["--repo", "***"]),
    (["--x=github_pat_k31abcdefghijklmnopqrstuvwxyz"], ["--x=***"]),
    # Not secrets: kept as they are.
    (["--lr", "3e-4", "--epochs", "3"], ["--lr", "3e-4", "--epochs", "3"]),
    (["--keyword", "cats", "--author", "me"], ["--keyword", "cats", "--author", "me"]),
    (["--output=run.json", "https://example.com/data.tar"], ["--output=run.json", "https://example.com/data.tar"]),
    (["-p", "8"], ["-p", "***"]),  # (-p is a password to mysql: hidden, a port too; cheap)
    (["--model", "hf_hub_model", "--task", "sk-learn"], ["--model", "hf_hub_model", "--task", "sk-learn"]),
]


@pytest.mark.parametrize("argv,stored", REDACTION_TABLE, ids=[" ".join(a)[:30] for a, _ in REDACTION_TABLE])
def test_command_line_secrets_are_hidden_by_family(argv, stored):
    assert redact_argv(["train.py", *argv]) == ["train.py", *stored]


def test_the_login_cookie_is_not_the_token_and_opens_only_its_own_port(collector):
    a, b = collector(token=TOKEN), collector(token=TOKEN)
    status, headers, _ = call(a, "GET", f"/?token={TOKEN}")
    cookie = headers["set-cookie"].split(";")[0]
    name, value = cookie.split("=", 1)
    assert status == 303 and name == f"starvewatch_session_{a.port}" and TOKEN not in value
    assert call(a, "GET", "/api/v1/runs", {"Cookie": cookie})[0] == 200
    # The browser sends it to every port of the host: another collector does not take it.
    assert call(b, "GET", "/api/v1/runs", {"Cookie": cookie})[0] == 401
    # The token itself in that cookie opens nothing.
    assert call(a, "GET", "/api/v1/runs", {"Cookie": f"{name}={TOKEN}"})[0] == 401


def test_the_login_cookie_reads_pages_only_and_expires(collector):
    """Issue 36: the cookie was a full, never-expiring API credential (a script in the
    collector's origin deleted runs with it)."""
    import hashlib
    import hmac as _hmac
    from tests.test_security import JSON, batch
    c = collector(token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert call(c, "POST", "/api/v1/ingest", {**JSON, **auth}, batch("kept"))[0] == 200
    status, headers, _ = call(c, "GET", f"/?token={TOKEN}")
    set_cookie = headers["set-cookie"]
    cookie = {"Cookie": set_cookie.split(";")[0]}
    assert "Max-Age=43200" in set_cookie
    assert call(c, "GET", "/api/v1/runs/kept", cookie)[0] == 200
    assert call(c, "GET", "/runs/kept", cookie)[0] == 200
    for method, path, body in (("POST", "/api/v1/ingest", batch("forged")), ("DELETE", "/api/v1/runs/kept", None),
                               ("POST", "/api/v1/runs/kept/tuning", b"{}")):
        status, _, text = call(c, method, path, {**JSON, **cookie}, body)
        assert status == 403 and b"reads pages only" in text, (method, path, status, text)
    assert call(c, "GET", "/api/v1/runs/kept", auth)[0] == 200  # nothing was deleted
    # An expired login (made with the collector's own secret, as a stolen old cookie would be).
    key = (c.directory / "session-secret").read_bytes()
    expired = int(time.time()) - 60
    mac = _hmac.new(key, f"starvewatch-session\0{TOKEN}\0{expired}".encode(), hashlib.sha256).hexdigest()
    assert call(c, "GET", "/api/v1/runs", {"Cookie": f"starvewatch_session_{c.port}={expired}.{mac}"})[0] == 401


def test_wrong_tokens_are_slowed_and_answered_one_at_a_time(collector):
    c = collector(token=TOKEN)
    statuses = []

    def guess(i):
        statuses.append(call(c, "GET", "/api/v1/runs", {"Authorization": f"Bearer guess-{i}"})[0])

    started = time.monotonic()
    threads = [threading.Thread(target=guess, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - started
    # At most 8 wrong answers of one client wait at once (guard.MAX_PENDING_PER_CLIENT); the
    # rest are answered 429 at once, their token not looked at (issue 36).
    # (More than 8 are looked at when the first answers went out before the last guesses came.)
    answered = statuses.count(401)
    assert set(statuses) <= {401, 429} and answered >= 8 and len(statuses) == 12, statuses
    # 0.05 s x (1 + 2 + ... + answered): the guesses looked at queue behind each other.
    assert elapsed >= 0.05 * answered * (answered + 1) / 2, (elapsed, statuses)
    started = time.monotonic()
    assert call(c, "GET", "/api/v1/runs", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert time.monotonic() - started < 1.5  # the right token is never slowed


def status_of(c, path="/healthz"):
    """The collector's answer, or None while it does not listen yet."""
    try:
        return c.request("GET", path)[0]
    except OSError:
        return None


def _serve(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_token_comes_from_the_environment_or_a_file_never_the_command_line(isolated_starvewatch, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # (one others may read is refused: test_private_files.py)
    for how in ("file", "env"):
        port = free_port()
        args = ["--port", str(port), "--dir", str(isolated_starvewatch)]
        env = dict(os.environ)
        if how == "file":
            args += ["--token-file", str(token_file)]
        else:
            env["STARVEWATCH_TOKEN"] = TOKEN
        proc = _serve(*args, env=env)
        c = Collector(isolated_starvewatch, port=port, token=TOKEN)
        try:
            wait_until(lambda: proc.poll() is not None or status_of(c) == 200,
                       what="the collector")
            assert proc.poll() is None
            assert Collector(isolated_starvewatch, port=port).request("GET", "/healthz")[0] == 401
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                cmdline = f.read()
            assert TOKEN.encode() not in cmdline  # `ps` shows nothing
        finally:
            proc.terminate()
            proc.communicate(timeout=30)


def test_off_loopback_a_short_token_is_refused_and_none_makes_a_strong_one_printed_once(isolated_starvewatch):
    port = free_port()
    env = {**os.environ, "STARVEWATCH_TOKEN": "short-token"}
    out = subprocess.run([sys.executable, "-m", "starvewatch", "serve", "--host", "0.0.0.0", "--port", str(port),
                          "--dir", str(isolated_starvewatch)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "at least 16 characters" in out.stderr and "Traceback" not in out.stderr

    env.pop("STARVEWATCH_TOKEN")
    proc = _serve("--host", "0.0.0.0", "--port", str(port), "--dir", str(isolated_starvewatch), env=env)
    try:
        line = ""
        while "token is" not in line:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        token = line.split("token is ")[1].split()[0]
        assert len(token) >= 32
        c = Collector(isolated_starvewatch, port=port, token=token)
        wait_until(lambda: status_of(c) == 200, what="the collector")
        assert Collector(isolated_starvewatch, port=port).request("GET", "/healthz")[0] == 401
    finally:
        proc.terminate()
        stdout, stderr = proc.communicate(timeout=30)
    assert token not in stdout + stderr  # printed once, and only there


def test_database_wal_spool_and_session_secret_are_owner_only(collector, isolated_starvewatch, monkeypatch):
    list(starvewatch.watch(range(20)))  # no collector reachable: the batches go to the spool
    starvewatch.finish()
    spool = isolated_starvewatch / "spool"
    files = [p for p in spool.rglob("*") if p.is_file()]
    dirs = [spool, *(p for p in spool.rglob("*") if p.is_dir())]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), \
        [(p, oct(p.stat().st_mode)) for p in files]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in dirs), [(p, oct(p.stat().st_mode)) for p in dirs]

    c = collector(token=TOKEN)
    call(c, "GET", f"/?token={TOKEN}")  # makes the session secret
    wait_until(lambda: c.get("/api/v1/runs")["runs"], what="the spooled run to be imported")
    made = [isolated_starvewatch / n for n in ("starvewatch.db", "starvewatch.db-wal", "starvewatch.db-shm",
                                              "session-secret")]
    assert all(p.exists() for p in made), made
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in made), [(p, oct(p.stat().st_mode)) for p in made]
