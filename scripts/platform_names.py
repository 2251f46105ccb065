"""Which files outside channels/ name a platform in code (issue 47's measure).

Counts the string literals and names that mention an installed platform in the product's
packages (daemon/, automations/), leaving out comments and docstrings: words that explain are
fine, code that branches on a platform is what adding one would have to touch.

    python scripts/platform_names.py
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

import channels.installed
from daemon.core.platforms import installed

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("daemon", "automations")


def docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


def mentions(path: Path, names: tuple[str, ...]) -> int:
    source = path.read_text(encoding="utf-8")
    skip = docstring_lines(ast.parse(source))
    count = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.STRING, tokenize.NAME) \
                and token.start[0] not in skip \
                and any(name in token.string.lower() for name in names):
            count += 1
    return count


def main() -> int:
    assert channels.installed.PLATFORMS
    names = tuple(installed())
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if count := mentions(path, names):
                found[path.relative_to(ROOT)] = count
    for path, count in sorted(found.items(), key=lambda item: -item[1]):
        print(f"{count:4d}  {path}")
    print(f"{len(found)} files outside channels/ name a platform ({', '.join(names)}) in code, "
          f"{sum(found.values())} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
