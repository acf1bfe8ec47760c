"""Encryption without a proxy (issue 27, item 7): `serve --ssl-certfile/--ssl-keyfile` with a
self-signed certificate made here (openssl), the hooks and the CLI verifying it (trusted through
STARVEWATCH_CA_FILE, refused without it), and a Secure login cookie."""
import os
import ssl
import subprocess
import sys

import httpx
import pytest

import starvewatch
from tests.conftest import free_port, wait_until

TOKEN = "tls-token-0123456789abcdef"


@pytest.fixture
def certificate(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture
def tls_collector(certificate, tmp_path):
    cert, key = certificate
    port = free_port()
    directory = tmp_path / "collector"  # not the trainer's: its spool is not swept here
    directory.mkdir()
    log = open(tmp_path / "collector.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "starvewatch", "serve", "--port", str(port), "--dir",
                             str(directory), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)],
                            env={**os.environ, "STARVEWATCH_TOKEN": TOKEN}, stdout=log, stderr=log)
    url = f"https://127.0.0.1:{port}"
    trusted = ssl.create_default_context(cafile=str(cert))

    def up():
        assert proc.poll() is None, (tmp_path / "collector.log").read_text()
        try:
            return httpx.get(url + "/healthz", verify=trusted, headers={"Authorization": f"Bearer {TOKEN}"},
                             timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout_s=30, what="the TLS collector")
        yield url, cert, trusted
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def _runs(url, trusted):
    response = httpx.get(url + "/api/v1/runs", verify=trusted, headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=10)
    return {r["name"]: r for r in response.json()["runs"]}


def test_hooks_and_cli_verify_the_certificate_and_the_cookie_is_secure(tls_collector, monkeypatch,
                                                                       isolated_starvewatch):
    url, cert, trusted = tls_collector
    monkeypatch.setenv("STARVEWATCH_URL", url)
    monkeypatch.setenv("STARVEWATCH_TOKEN", TOKEN)

    # Not trusted (a self-signed certificate, no CA file): nothing is sent to it.
    monkeypatch.delenv("STARVEWATCH_CA_FILE", raising=False)
    monkeypatch.setenv("STARVEWATCH_RUN_NAME", "untrusted")
    list(starvewatch.watch(range(10), name="train"))
    starvewatch.finish()  # delivers what it can before returning: here, nothing
    assert _runs(url, trusted) == {}
    assert list((isolated_starvewatch / "spool").rglob("*.json.gz"))  # kept in the spool instead
    refused = subprocess.run([sys.executable, "-m", "starvewatch", "runs", "--url", url],
                             capture_output=True, text=True, timeout=60, env={**os.environ})
    assert refused.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in refused.stderr, refused.stderr[-500:]

    # Trusted through STARVEWATCH_CA_FILE: the hooks deliver, the CLI reads.
    monkeypatch.setenv("STARVEWATCH_CA_FILE", str(cert))
    monkeypatch.setenv("STARVEWATCH_RUN_NAME", "over-tls")
    list(starvewatch.watch(range(30), name="train"))
    starvewatch.finish()
    run = wait_until(lambda: _runs(url, trusted).get("over-tls"), what="the run over TLS")
    assert run["steps"] == 30
    listed = subprocess.run([sys.executable, "-m", "starvewatch", "runs", "--url", url],
                            capture_output=True, text=True, timeout=60, env={**os.environ})
    assert listed.returncode == 0 and "over-tls" in listed.stdout, listed.stderr[-500:]

    # A browser's login cookie is Secure: never sent over plain HTTP.
    response = httpx.get(f"{url}/?token={TOKEN}", verify=trusted, follow_redirects=False, timeout=10)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert "Secure" in cookie and "HttpOnly" in cookie and TOKEN not in cookie
