"""The largest classes and functions of a package, in lines, against the limits of STYLE.md.

    python bench/code_size.py [daemon] [--top 10]

Prints the largest class and function, every one over the limits (a class over 300 lines, a
function over 60) and how many there are. Lines run from the `def`/`class` line (or its first
decorator) to the last line of the body, docstring and comments included. A nested function is
counted on its own and within the function that holds it.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASS_LIMIT = 300
FUNCTION_LIMIT = 60


@dataclass(frozen=True)
class Block:
    kind: str  # "class" or "function"
    name: str  # path:Qualified.name
    lines: int


def blocks(folder: Path) -> Iterator[Block]:
    """Every class and function (methods and nested ones too) in the .py files under `folder`."""
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        where = path.relative_to(ROOT).as_posix()
        yield from _walk(tree, where, "")


def _walk(node: ast.AST, where: str, prefix: str) -> Iterator[Block]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
            last = child.end_lineno or child.lineno
            kind = "class" if isinstance(child, ast.ClassDef) else "function"
            name = f"{prefix}{child.name}"
            yield Block(kind, f"{where}:{name}", last - first + 1)
            yield from _walk(child, where, f"{name}.")
        else:
            yield from _walk(child, where, prefix)


def over_limits(found: list[Block]) -> list[Block]:
    limit = {"class": CLASS_LIMIT, "function": FUNCTION_LIMIT}
    return sorted((b for b in found if b.lines > limit[b.kind]), key=lambda b: -b.lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="daemon")
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    found = list(blocks(ROOT / args.package))
    for kind, limit in (("class", CLASS_LIMIT), ("function", FUNCTION_LIMIT)):
        ranked = sorted((b for b in found if b.kind == kind), key=lambda b: -b.lines)
        over = [b for b in ranked if b.lines > limit]
        print(f"{kind}es" if kind == "class" else "functions", f"in {args.package}/:",
              f"{len(ranked)}, largest {ranked[0].lines} lines ({ranked[0].name}),",
              f"{len(over)} over {limit}")
        for block in (over or ranked[:args.top]):
            print(f"  {block.lines:5d}  {block.name}")


if __name__ == "__main__":
    main()
