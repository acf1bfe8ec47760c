"""The store's SQL, written for SQLite, run on PostgreSQL: a connection that looks like the
sqlite3 one the readers, exports and folds use (execute / executemany / fetch*, rows readable
by index and by column name), and the translation of the few SQLite idioms they use.

Its own module because the readers (query.py, folded_reads.py, exports) stay one text for both
databases: the SQLite path runs its SQL unchanged (no layer in between, so no cost), and only a
PostgreSQL store pays for translating a statement, once (cached by text).

Translated: `?` placeholders, `INSERT OR IGNORE`, `INSERT OR REPLACE INTO meta`, the scalar
two-argument max()/min() (GREATEST/LEAST), sum() of a comparison (SQLite's booleans are
integers), `temp.` tables and `WHERE 0`. `rowid` is a real column of every table that is read
in rowid order (pg_schema.py), so it needs no translation.
"""
from __future__ import annotations

import re
import threading
from functools import lru_cache

_INSERT_OR = re.compile(r"^\s*INSERT\s+OR\s+(IGNORE|REPLACE)\s+INTO\s+(\w+)", re.I)
_FUNC = re.compile(r"\b(max|min|sum)\s*\(", re.I)
_COMPARISON = re.compile(r"(<=|>=|<>|!=|=|<|>)")


def _split_literals(sql: str) -> list[tuple[bool, str]]:
    """(is_literal, text) pieces: SQL outside '...' literals is translated, literals never."""
    out, i, start = [], 0, 0
    while i < len(sql):
        if sql[i] == "'":
            out.append((False, sql[start:i]))
            j = i + 1
            while True:
                j = sql.index("'", j)
                if j + 1 < len(sql) and sql[j + 1] == "'":
                    j += 2
                    continue
                break
            out.append((True, sql[i:j + 1]))
            i = start = j + 1
        else:
            i += 1
    out.append((False, sql[start:]))
    return out


def _top_level_args(text: str, open_at: int) -> tuple[list[str], int]:
    """The comma-separated arguments of the call whose '(' is at open_at, and the index of ')'."""
    depth, args, start = 0, [], open_at + 1
    for i in range(open_at, len(text)):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(text[start:i])
                return args, i
        elif c == "," and depth == 1:
            args.append(text[start:i])
            start = i + 1
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _functions(text: str) -> str:
    """max(a, b) -> GREATEST(a, b); min(a, b) -> LEAST(a, b); sum(a > b) -> sum((a > b)::int)."""
    out, pos = [], 0
    while (m := _FUNC.search(text, pos)) is not None:
        name = m.group(1).lower()
        args, close = _top_level_args(text, m.end() - 1)
        inner = [_functions(a) for a in args]
        out.append(text[pos:m.start()])
        if name in ("max", "min") and len(args) > 1:
            out.append(("GREATEST(" if name == "max" else "LEAST(") + ",".join(inner) + ")")
        elif name == "sum" and _COMPARISON.search(_strip_parens(inner[0])):
            out.append(f"sum(({inner[0]})::int)")
        else:
            out.append(text[m.start():m.end()] + ",".join(inner) + ")")
        pos = close + 1
    out.append(text[pos:])
    return "".join(out)


def _strip_parens(text: str) -> str:
    """The text outside nested parentheses (a comparison inside a call does not count)."""
    out, depth = [], 0
    for c in text:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


_INSERT_INTO = re.compile(r"^\s*INSERT\s+INTO\s+(\w+)", re.I)
_IDENT = re.compile(r"(?<![.\w])([A-Za-z_]\w*)\b(?!\s*\()")


@lru_cache(maxsize=None)
def _columns() -> dict[str, frozenset]:
    """Each table's columns, read from the PostgreSQL DDL (pg_schema.py)."""
    from .pg_schema import DDL
    out = {}
    for m in re.finditer(r"CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\)(?: PARTITION BY [^;]*)?;", DDL, re.S):
        names = {line.strip().split()[0].strip('"') for line in re.split(r",(?![^(]*\))", m.group(2))}
        out[m.group(1)] = frozenset(n for n in names if n.upper() not in ("PRIMARY", "UNIQUE"))
    return out


def _qualify_update(sql: str) -> str:
    """In an upsert's DO UPDATE SET, a bare column on the right of `=` is the stored row's:
    SQLite reads it so, PostgreSQL calls it ambiguous. Qualified with the table's name."""
    m = _INSERT_INTO.match(sql)
    at = sql.upper().find("DO UPDATE SET")
    if m is None or at < 0:
        return sql
    table = m.group(1)
    columns = _columns().get(table, frozenset())
    head, tail = sql[:at + len("DO UPDATE SET")], sql[at + len("DO UPDATE SET"):]

    def qualify(match: re.Match) -> str:
        name = match.group(1)
        if name not in columns:
            return name
        before = tail[:match.start()].rstrip()
        after = tail[match.end():].lstrip()
        if (before == "" or before.endswith(",")) and after.startswith("=") and not after.startswith("=="):
            return name  # the column assigned
        return f"{table}.{name}"

    return head + _IDENT.sub(qualify, tail)


@lru_cache(maxsize=2048)
def to_postgres(sql: str) -> str:
    """The statement in PostgreSQL's dialect (psycopg's %s placeholders)."""
    suffix = ""
    m = _INSERT_OR.match(sql)
    if m is not None:
        kind, table = m.group(1).upper(), m.group(2)
        sql = sql[:m.start()] + f"INSERT INTO {table}" + sql[m.end():]
        if kind == "IGNORE":
            suffix = " ON CONFLICT DO NOTHING"
        elif table == "meta":
            suffix = " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        else:
            raise ValueError(f"INSERT OR REPLACE INTO {table}: no PostgreSQL form defined")
    pieces = []
    for literal, text in _split_literals(sql):
        if literal:
            pieces.append(text.replace("%", "%%"))
            continue
        text = text.replace("%", "%%").replace("?", "%s")
        text = re.sub(r"\btemp\.", "pg_temp.", text)
        text = re.sub(r"\bWHERE 0\b", "WHERE false", text)
        pieces.append(text)
    return _qualify_update(_functions("".join(pieces)) + suffix)


class Row(tuple):
    """A row read by index or by column name, as sqlite3.Row."""

    __slots__ = ()
    _names: tuple = ()

    def __getitem__(self, key):
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


@lru_cache(maxsize=512)
def _row_class(names: tuple) -> type:
    return type("Row", (Row,), {"__slots__": (), "_names": names, "_index": {n: i for i, n in enumerate(names)}})


def row_factory(cursor):
    description = cursor.description
    if description is None:
        return tuple
    cls = _row_class(tuple(d.name for d in description))
    return cls


def _numeric_loader():
    """sum() and avg() of integers are NUMERIC in PostgreSQL: read them as int (or float), as
    SQLite gives them, never as Decimal (orjson and the float arithmetic of the readers)."""
    from psycopg.adapt import Loader

    class NumericLoader(Loader):
        def load(self, data):
            text = bytes(data)
            if b"." in text or b"N" in text or b"e" in text:
                return float(text)
            return int(text)

    return NumericLoader


def connect(url: str, **kwargs):
    """An autocommit psycopg connection whose rows read as sqlite3.Row and whose NUMERIC are
    numbers: the store's own statements say BEGIN and COMMIT, as on SQLite."""
    import psycopg
    # Parameters bound client-side: SQLite's statements repeat a parameter in SELECT and GROUP
    # BY (`step / ?`), which PostgreSQL matches only as the same literal, never as $1 and $4.
    conn = psycopg.connect(url, autocommit=True, row_factory=row_factory, cursor_factory=psycopg.ClientCursor,
                           **kwargs)
    conn.adapters.register_loader("numeric", _numeric_loader())
    return conn


class Connection:
    """A psycopg connection behind the sqlite3 calls the shared readers and folds make."""

    def __init__(self, conn) -> None:
        self.raw = conn
        self.lock = threading.RLock()  # one statement at a time on a connection shared by threads

    def execute(self, sql: str, params=()):
        if sql in ("BEGIN IMMEDIATE", "BEGIN"):
            sql = "BEGIN"
        # Always a parameter tuple: psycopg then reads %% as %, as the translation wrote it.
        return self.raw.execute(to_postgres(sql), tuple(params))

    def executemany(self, sql: str, rows):
        cursor = self.raw.cursor()
        cursor.executemany(to_postgres(sql), list(rows))
        return cursor

    def executescript(self, script: str):
        return self.raw.execute(script)

    def commit(self) -> None:
        if not self.raw.autocommit:
            self.raw.commit()

    def close(self) -> None:
        self.raw.close()
