"""Files and directories (issue 36 item 5): a STARVEWATCH_DIR of another user, or writable by
others, is refused with a message; files are opened without following symlinks; every file
starvewatch writes is 0600 in 0700 directories (the /dev/shm board too); a token file others
may read is refused. The other owner is a real second uid (tests/other_user.py)."""
import os
import stat
import subprocess
import sys

import starvewatch
from tests.other_user import other_user


def _serve(directory, *extra):
    return subprocess.run([sys.executable, "-m", "starvewatch", "serve", "--dir", str(directory), "--port", "1",
                           *extra], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, STARVEWATCH_DIR=str(directory)))


def test_a_directory_of_another_user_or_writable_by_others_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    user = other_user()
    os.chown(theirs, user.pw_uid, user.pw_gid)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    for directory, said in ((theirs, f"belongs to uid {user.pw_uid}"), (shared, "writable by other users")):
        out = _serve(directory)
        assert out.returncode != 0 and said in out.stderr, out.stderr
        monkeypatch.setenv("STARVEWATCH_DIR", str(directory))
        monkeypatch.setenv("STARVEWATCH_URL", "off")
        assert starvewatch.init("refused") is None  # training goes on, unmonitored
        assert list(starvewatch.watch(range(3))) == [0, 1, 2]
        starvewatch.finish()
        assert not (directory / "spool").exists()


def test_a_token_file_others_may_read_is_refused(tmp_path):
    token = tmp_path / "token"
    token.write_text("a-long-enough-token-0123456789\n")
    token.chmod(0o644)
    out = _serve(tmp_path / "sw", "--token-file", str(token))
    assert out.returncode != 0 and "other users may read it" in out.stderr, out.stderr


def test_lock_and_log_are_never_followed_through_a_symlink(tmp_path, capsys):
    from starvewatch.hooks.delivery import collector_link
    from starvewatch.hooks.delivery.transport import HttpTransport
    from tests.conftest import free_port
    directory = tmp_path / "sw"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    for name in ("collector.lock", "collector.log"):
        link = directory / name
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(victim)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        found = collector_link.find_collector(url, directory, HttpTransport(url), autostart=True, local_rank=0)
        assert found == "none" and victim.read_text() == "keep me", (name, found)
        assert "cannot start a collector" in capsys.readouterr().err
        link.unlink()


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_every_file_is_owner_only_the_shared_memory_board_too(tmp_path):
    from starvewatch.hooks.stacks import dump_self
    from starvewatch.hooks.workers import WorkerBoard
    from starvewatch.local_secrets import collector_key, local_token
    board = WorkerBoard(2, str(tmp_path))
    assert _mode(board.path) == 0o600, oct(_mode(board.path))
    assert dump_self(str(tmp_path / "main.stack")) and _mode(tmp_path / "main.stack") == 0o600
    private = tmp_path / "private"
    assert collector_key(private, make=True) and local_token(private, make=True)
    assert _mode(private) == 0o700 and _mode(private / "collector-key") == 0o600
    assert _mode(private / "local-token") == 0o600
    (private / "local-token").chmod(0o644)  # a secret others may read is refused, not used
    from starvewatch.local_secrets import UnsafeSecret
    try:
        local_token(private)
    except UnsafeSecret as exc:
        assert "chmod 600" in str(exc)
    else:
        raise AssertionError("a world-readable token file was used")
