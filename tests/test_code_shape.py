"""The package's functions stay short enough to read: none is over 80 lines unless its docstring
gives the reason, on a line starting `Long:` (a table that reads best whole, a sequence that
must stay in one frame). Read from the source (ast), so a new long function fails here at once.
"""
from __future__ import annotations

import ast
from pathlib import Path

import starvewatch

ROOT = Path(starvewatch.__file__).resolve().parent
MAX_LINES = 80


def long_functions(root: Path = ROOT, max_lines: int = MAX_LINES) -> list[str]:
    """'path:line name (N lines)' for each function or method over `max_lines` lines (its
    decorators and docstring included) whose docstring has no line starting `Long:`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - first + 1
            if lines <= max_lines:
                continue
            doc = ast.get_docstring(node) or ""
            if any(line.strip().startswith("Long:") for line in doc.splitlines()):
                continue
            found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_over_80_lines_without_a_reason():
    assert long_functions() == [], "split these, or say in the docstring why not (a line 'Long: ...')"


def test_the_check_finds_a_long_function_and_accepts_a_reason(tmp_path):
    """The check itself can fail: an 81-line function is found, and a reason lets it pass."""
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    (tmp_path / "long.py").write_text(f'def long():\n    """Sums."""\n{body}')
    (tmp_path / "reasoned.py").write_text(f'def reasoned():\n    """Sums.\n\n    Long: a table.\n    """\n{body}')
    (tmp_path / "short.py").write_text(f'def short():\n{body}')
    found = long_functions(tmp_path)
    assert len(found) == 1 and "long.py:1 long (81 lines)" in found[0], found
