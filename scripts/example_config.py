"""Write roost.example.toml from README.md's configuration reference.

The README's key tables are the one place each key is explained; the example is derived from
them so that the two cannot drift (tests/test_readme.py checks that the committed file is what
this renders). Run `python scripts/example_config.py` after changing the reference.
"""

from __future__ import annotations

import re
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
# `[name]`, `[[name]]` and a dotted table of one per name, such as `[mcp.servers.NAME]`.
HEADING = re.compile(r"^### `(\[\[?\w+(?:\.\w+)*\]\]?)`\s*$")
PER_NAME = re.compile(r"^\[mcp\.servers\.[\w-]+\]$")  # the example's one stands for NAME
ROW = re.compile(r"^\| `(\w+)` \| (.*?) \| (.*) \|\s*$")
WIDTH = 96
# Prose and an example, no key table: any key, or a table per person (`[people.NAME]`, whose
# example tables follow the heading).
FREE_TABLES = ("[variables]", "[identities]", "[people]")

HEADER = """\
# roost.example.toml: every key roost reads, each with what it does and its default.
# Generated from README.md's configuration reference by `python scripts/example_config.py`;
# edit the README, not this file. Copy it to ~/.config/roost/roost.toml (or
# /etc/roost/roost.toml for the system service) and change what you need: a line `key = value`
# is the default, a line `#key = value` is an example to uncomment. Secrets (tokens) never go in
# this file; they come from the environment or from credential files (README, "Secrets")."""


def _plain(markdown: str) -> str:
    """Table cell text as a comment reads it: no backticks, no link targets."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", markdown)
    return text.replace("`", "")


def _literal(default: str) -> str | None:
    """The default as a TOML value, when the cell is one (`"3h"`, `8192`, `[]`)."""
    match = re.fullmatch(r"`([^`]+)`", default.strip())
    if not match:
        return None
    try:
        tomllib.loads(f"k = {match[1]}")
    except tomllib.TOMLDecodeError:
        return None
    return match[1]


def _example_values(page: str) -> dict[str, dict[str, str]]:
    """Values of the example configuration (docs/config-example.md), per table (the first of
    an array of tables)."""
    example = re.findall(r"```toml\n(.*?)```", page, re.S)[-1]
    values: dict[str, dict[str, str]] = {}
    table = ""
    for line in example.splitlines():
        if line.startswith("["):
            table = line.split("#")[0].strip()
            table = "[mcp.servers.NAME]" if PER_NAME.match(table) else table
            values.setdefault(table, {})
        elif match := re.match(r"^(\w+) = (.*?)(\s+#.*)?$", line):
            values[table].setdefault(match[1], match[2])
    return values


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - 2, initial_indent="# ", subsequent_indent="# ",
                         break_on_hyphens=False)


def _free_example(table: str, examples: dict[str, dict[str, str]]) -> list[str]:
    """A free table's example, commented: its keys, then each of its sub-tables
    (`[people.sam]` of `[people]`) with theirs."""
    lines = [f"#{key} = {value}" for key, value in examples.get(table, {}).items()]
    for sub, values in examples.items():
        if sub.startswith(table[:-1] + "."):
            lines += [f"#{sub}", *(f"#{key} = {value}" for key, value in values.items())]
    return lines


def render(readme: str, example: str) -> str:
    """roost.example.toml from the README's reference and docs/config-example.md's values."""
    section = readme.partition(START)[2].partition(END)[0]
    examples = _example_values(example)
    out = [HEADER]
    table: str | None = None
    prose: list[str] = []
    for line in section.splitlines():
        if heading := HEADING.match(line):
            table, prose = heading[1], []
            commented = (table.startswith("[[") or table in FREE_TABLES
                         or table.endswith(".NAME]"))
            out += ["", *(["#" + table] if commented else [table])]
            continue
        if table is None or line.startswith("###"):
            table = None if line.startswith("###") else table
            continue
        if table in FREE_TABLES:
            if line.strip():
                prose.append(line.strip())
            elif prose:
                out[-1:-1] = _comment(_plain(" ".join(prose)))
                prose = []
                out += _free_example(table, examples)
            continue
        if not (row := ROW.match(line)) or row[1] == "Key":
            continue
        key, default, meaning = row[1], row[2], row[3]
        out += _comment(_plain(meaning))
        value = _literal(default)
        if value is None:
            out += _comment(f"Default: {_plain(default)}.")
        if value is not None and not table.startswith("[[") and not table.endswith(".NAME]"):
            out.append(f"{key} = {value}")
        else:
            out.append(f"#{key} = {value if value is not None else examples[table][key]}")
    return "\n".join(out) + "\n"


def main() -> int:
    text = render((ROOT / "README.md").read_text("utf-8"),
                  (ROOT / "docs" / "config-example.md").read_text("utf-8"))
    (ROOT / "roost.example.toml").write_text(text, "utf-8")
    print(f"wrote {ROOT / 'roost.example.toml'} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
