"""How the hooks and the CLI trust a collector served over HTTPS (stdlib only; shared).

The system's certificate authorities, as any HTTPS client; for a collector with a self-signed
or private-CA certificate, `STARVEWATCH_CA_FILE` names the PEM file to trust instead. The
certificate and its host name are always verified: there is no switch to turn that off.
"""
from __future__ import annotations

import os
import ssl

CA_FILE_VARIABLE = "STARVEWATCH_CA_FILE"


def client_context() -> ssl.SSLContext:
    cafile = os.environ.get(CA_FILE_VARIABLE) or None
    return ssl.create_default_context(cafile=cafile)
