"""The largest classes and functions of a package, in lines, against the limits of STYLE.md.

    python bench/code_size.py [daemon] [--top 5] [--against main]

Prints the largest class and function, every one over the limits (a class over 300 lines, a
function over 60) and how many there are; with `--against REV`, the same figures for that git
revision first, as the baseline, and the ratio of the largest ones. Lines run from the
`def`/`class` line (or its first decorator) to the last line of the body, docstring and
comments included. A nested function is counted on its own and within the function that holds
it.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLASS_LIMIT = 300
FUNCTION_LIMIT = 60
LIMITS = {"class": CLASS_LIMIT, "function": FUNCTION_LIMIT}


@dataclass(frozen=True)
class Block:
    kind: str  # "class" or "function"
    name: str  # path:Qualified.name
    lines: int


def blocks(folder: Path) -> Iterator[Block]:
    """Every class and function (methods and nested ones too) in the .py files under `folder`."""
    for path in sorted(folder.rglob("*.py")):
        yield from _blocks_of(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())


def blocks_at(revision: str, package: str) -> Iterator[Block]:
    """The same for `package` as it is at a git revision (read with git, nothing checked out)."""
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", revision, "--", package],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    for where in sorted(p for p in listed.splitlines() if p.endswith(".py")):
        text = subprocess.run(["git", "show", f"{revision}:{where}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        yield from _blocks_of(text, where)


def over_limits(found: list[Block]) -> list[Block]:
    return sorted((b for b in found if b.lines > LIMITS[b.kind]), key=lambda b: -b.lines)


def _blocks_of(text: str, where: str) -> Iterator[Block]:
    yield from _walk(ast.parse(text, where), where, "")


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


def report(title: str, found: list[Block], top: int) -> dict[str, int]:
    """Print the figures; return the largest class and function."""
    print(title)
    largest: dict[str, int] = {}
    for kind, limit in LIMITS.items():
        ranked = sorted((b for b in found if b.kind == kind), key=lambda b: -b.lines)
        over = [b for b in ranked if b.lines > limit]
        largest[kind] = ranked[0].lines
        print(f"  {'classes' if kind == 'class' else 'functions'}: {len(ranked)}, largest "
              f"{ranked[0].lines} lines ({ranked[0].name}), {len(over)} over {limit}")
        for block in (over or ranked[:top]):
            print(f"    {block.lines:5d}  {block.name}")
    return largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default="daemon")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="a git revision as the baseline")
    args = parser.parse_args()
    if args.against:
        before = report(f"{args.package}/ at {args.against}:",
                        list(blocks_at(args.against, args.package)), args.top)
    after = report(f"{args.package}/ here:", list(blocks(ROOT / args.package)), args.top)
    if args.against:
        for kind in LIMITS:
            print(f"largest {kind}: {before[kind]} -> {after[kind]} lines "
                  f"(x{after[kind] / before[kind]:.2f})")


if __name__ == "__main__":
    main()
