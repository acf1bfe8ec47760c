"""A second local user for the tests that check what another account of the machine can do
(issue 36): a real uid, made with `useradd` when missing (the tests run as root, here and in
CI), running stdlib-only scripts with the system's Python (the project's virtual environment may
sit in a directory that user cannot enter)."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys

NAME = "sw-other"


def other_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(NAME)
    except KeyError:
        pass
    assert os.geteuid() == 0, "the other-user tests run as root (they create a second uid)"
    subprocess.run([shutil.which("useradd") or "/usr/sbin/useradd", "--system", "--no-create-home",
                    "--shell", "/usr/sbin/nologin", NAME], check=True, capture_output=True)
    return pwd.getpwnam(NAME)


def python_for_other() -> str:
    """A Python the other user can run (stdlib only)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        if os.path.exists(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError("no Python for the other user")


def run_as_other(script: str, *args: str, timeout_s: float = 120, **kwargs) -> subprocess.CompletedProcess:
    user = other_user()
    return subprocess.run([python_for_other(), "-c", script, *args], user=user.pw_uid, group=user.pw_gid,
                          extra_groups=[], capture_output=True, text=True, timeout=timeout_s, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/"}, **kwargs)


def popen_as_other(script: str, *args: str, **kwargs) -> subprocess.Popen:
    user = other_user()
    return subprocess.Popen([python_for_other(), "-c", script, *args], user=user.pw_uid, group=user.pw_gid,
                            extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
