"""Secrets out of what is stored and shown (stdlib only; shared by the hooks and the collector).

A run's metadata keeps the training command line for the record, and command lines carry
secrets. Their values are replaced before they are stored:
- the value of an option whose name has a word of a secret family (key, pass, pw, pwd, secret,
  token, auth, cookie, bearer, credential, private, signature/signing: `--hf-token X`,
  `--wandb-key=X`, `--private-key X`, `-p X`, `--session-cookie X`);
- `NAME=value` arguments whose name is one (`HF_TOKEN=...`, `db.password=...`);
- credentials inside URLs (`https://user:pw@host`, `?token=...`, `#access_token=...`, an Azure
  SAS's `sig=`) and `Bearer ...` values;
- header-like `X-Api-Key: value` text and `password=value` pairs inside one argument (a
  PostgreSQL conninfo), a glued `-pSECRET` (mysql);
- values shaped like a known service's token whatever the option's name (`hf_...`, `sk-...`,
  `ghp_...`, `github_pat_...`, `xox?-...`, `AKIA...`).
Names are split into words (`--wandbApiKey` is wandb, api, key), and a family may end a word
(`apikey`, `hftoken`): hiding a harmless value is cheap, keeping a secret is not.
"""
from __future__ import annotations

import re

HIDDEN = "***"
_FAMILIES = (r"keys?|pass|passwd|passwords?|passphrase|pw|pwd|secrets?|tokens?|auth|authorization|"
             r"cookies?|bearer|credentials?|creds|private|privkey|signature|signing|sig")
# One word of a name: a family at its end, perhaps followed by "file" or "path" (`keyfile`).
_SECRET_WORD = re.compile(rf"^[a-z0-9]*?(?:{_FAMILIES})(?:file|path)?$")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_SHORT_SECRET_FLAGS = frozenset({"-p"})  # mysql, psql and friends: -p PASSWORD
_ASSIGNMENT = re.compile(r"^(-{0,2}[A-Za-z_][A-Za-z0-9_.\-]*)=(.*)$", re.DOTALL)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#@\s]+@")
_URL_QUERY_PAIR = re.compile(r"([?&;#])([^=&#\s]+)=([^&#\s]*)")
# `name=value` inside a longer text (a conninfo: `host=db password=x`), and `Name: value` headers.
_TEXT_PAIR = re.compile(r"(^|[\s,])([A-Za-z_][A-Za-z0-9_.\-]*)=([^\s,]+)")
_HEADER = re.compile(r"^([A-Za-z][A-Za-z0-9\-]*)(\s*:\s*)(.+)$", re.DOTALL)
_GLUED_P = re.compile(r"^-p(\S+)$")
# Values shaped like a service's token, under any name (Hugging Face, OpenAI, GitHub, Slack, AWS).
_TOKEN_SHAPED = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|"
                           r"github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9\-]{10,}|AKIA[0-9A-Z]{16})\b")
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|token)(\s+)\S+")


def is_secret_name(name: str) -> bool:
    """Whether an option or variable name (`--hf-token`, `HF_TOKEN`, `db.password`) names a secret."""
    words = [w.lower() for w in _WORD_SPLIT.split(name.strip("-")) if w]
    return any(_SECRET_WORD.match(word) for word in words)


def is_secret_option(option: str) -> bool:
    name = option.partition("=")[0]
    return option.startswith("-") and (name in _SHORT_SECRET_FLAGS or is_secret_name(name))


def redact_text(text: str) -> str:
    """Credentials inside one argument's text: URL user info, secret query pairs, bearer values."""
    text = _TOKEN_SHAPED.sub(HIDDEN, text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{HIDDEN}@", text)
    text = _URL_QUERY_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}={HIDDEN}"
                               if is_secret_name(m.group(2)) else m.group(0), text)
    text = _TEXT_PAIR.sub(lambda m: f"{m.group(1)}{m.group(2)}={HIDDEN}"
                          if is_secret_name(m.group(2)) else m.group(0), text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m.group(1)}{m.group(2)}{HIDDEN}", text)
    header = _HEADER.match(text)
    if header and is_secret_name(header.group(1)) and HIDDEN not in header.group(3) \
            and not header.group(3).startswith("//"):
        return f"{header.group(1)}{header.group(2)}{HIDDEN}"
    return text


def redact_arg(arg: str) -> tuple[str, bool]:
    """One argument redacted, and whether the next one is a secret option's value."""
    assignment = _ASSIGNMENT.match(arg)
    if assignment and (is_secret_name(assignment.group(1)) or assignment.group(1) in _SHORT_SECRET_FLAGS):
        return f"{assignment.group(1)}={HIDDEN}", False
    if _GLUED_P.match(arg):  # mysql's -pPASSWORD
        return f"-p{HIDDEN}", False
    if is_secret_option(arg) and "=" not in arg:
        return arg, True
    return redact_text(arg), False


def redact_argv(argv: list) -> list:
    """`argv` with every secret-looking value hidden (see the module's docstring)."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append(HIDDEN)
            hide_next = False
            continue
        if not isinstance(arg, str):
            out.append(arg)
            continue
        shown, hide_next = redact_arg(arg)
        out.append(shown)
    return out
