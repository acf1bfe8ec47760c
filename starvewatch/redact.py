"""Secrets out of what is stored and shown (stdlib only; shared by the hooks and the collector).

A run's metadata keeps the training command line for the record, and command lines carry
secrets (`--hf-token abc`, `--api-key=...`). Their values are replaced before they are stored.
"""
from __future__ import annotations

SECRET_WORDS = ("token", "secret", "password", "passwd", "api-key", "api_key", "apikey", "credential", "auth")
HIDDEN = "***"


def is_secret_option(option: str) -> bool:
    name = option.lstrip("-").lower()
    return option.startswith("-") and any(word in name for word in SECRET_WORDS)


def redact_argv(argv: list) -> list:
    """`argv` with the value of every secret-looking option hidden (`--token X`, `--token=X`)."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        if isinstance(arg, str) and is_secret_option(arg):
            option, eq, _ = arg.partition("=")
            if eq:
                out.append(f"{option}={HIDDEN}")
                continue
            hide_next = True
        out.append(arg)
    return out
