"""README.md and docs/ as a reader sees them, and roost.example.toml, which is generated from the
README's configuration reference (scripts/example_config.py)."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import re
from pathlib import Path
from types import ModuleType

from markdown_it import MarkdownIt
from markdown_it.token import Token

from daemon.cli.main import build_parser
from daemon.core.config import config_keys, load_settings
from daemon.core.platforms import installed
from daemon.engine.chat_commands import Commands
from daemon.engine.facts_commands import FactsCommands

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
EXAMPLE = ROOT / "roost.example.toml"
README_MAX_LINES = 770  # the front door: setup and use; depth goes to docs/


def docs_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_readme_stays_short_enough_to_read() -> None:
    assert len(README.read_text("utf-8").splitlines()) <= README_MAX_LINES


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_config",
                                                  ROOT / "scripts" / "example_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loose_table_rows(markdown: str) -> list[tuple[int, str]]:
    """Lines that look like table rows but render as text: a table cut by a blank line, or
    rows without a header. (Fenced code is its own token, so examples are left alone.)"""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    loose = []
    for opening, inline in itertools.pairwise(tokens):
        if opening.type == "paragraph_open" and inline.type == "inline" and opening.map:
            for offset, line in enumerate(inline.content.splitlines()):
                if line.lstrip().startswith("|"):
                    loose.append((opening.map[0] + offset + 1, line[:60]))
    return loose


def test_every_table_of_the_readme_and_docs_is_whole() -> None:
    for page in [README, *docs_pages()]:
        assert loose_table_rows(page.read_text("utf-8")) == [], page.name


def test_a_cut_table_is_caught() -> None:
    cut = "| A | B |\n| --- | --- |\n| 1 | 2 |\n\n| 3 | 4 |\n"
    assert loose_table_rows(cut) == [(5, "| 3 | 4 |")]
    assert loose_table_rows(cut.replace("\n\n", "\n")) == []


def test_the_example_config_is_what_the_readme_reference_renders() -> None:
    rendered = generator().render(README.read_text("utf-8"),
                                  (ROOT / "docs" / "config-example.md").read_text("utf-8"))
    assert EXAMPLE.read_text("utf-8") == rendered, (
        "roost.example.toml is stale: run `python scripts/example_config.py`")


def example_keys() -> dict[str, set[str]]:
    """The keys the example sets or shows commented out, per table."""
    keys: dict[str, set[str]] = {}
    table = ""
    for line in EXAMPLE.read_text("utf-8").splitlines():
        if match := re.fullmatch(r"#?(\[\[?\w+(?:\.\w+)*\]\]?)", line):
            table = match[1]
            keys[table] = set()
        elif match := re.match(r"^#?(\w+) = ", line):
            keys[table].add(match[1])
    return keys


def test_every_config_key_is_in_the_example() -> None:
    keys = example_keys()
    for table, schema in config_keys().items():
        assert schema - keys.get(table, set()) == set(), table
        assert keys[table] - schema == set(), table


def test_the_example_loads_as_it_is_and_with_every_line_uncommented(tmp_path: Path) -> None:
    text = EXAMPLE.read_text("utf-8")
    as_is = tmp_path / "as-is.toml"
    as_is.write_text(text, "utf-8")
    settings = load_settings(as_is, env={})
    assert not settings.platforms["telegram"].enabled and settings.automations == ()

    uncommented = tmp_path / "uncommented.toml"
    # An MCP server is either a command or a url: the url line stays commented; NAME is named.
    uncommented.write_text(re.sub(r"^#(?=[\[\w])(?!url = )", "", text, flags=re.M)
                           .replace("[mcp.servers.NAME]", "[mcp.servers.github]"), "utf-8")
    full = load_settings(uncommented, env={}, require_secrets=False)
    assert [automation.name for automation in full.automations] == ["morning-brief"]
    assert full.variables["city"] == "Berlin"
    assert dict(full.identities) == {"owner": ("telegram:1111111", "whatsapp:972544401243",
                                               "matrix:@dana:example.org")}
    (server,) = full.mcp.servers
    assert (server.name, server.command, server.approve) == ("github", "npx", "ask")


def test_the_body_limits_the_readme_gives_are_the_channels() -> None:
    from channels.telegram.channel import TelegramTuning
    from channels.whatsapp.channel import WhatsAppTuning

    mib = 1024 * 1024
    text = " ".join((DOCS / "security.md").read_text("utf-8").split())
    assert (f"{TelegramTuning.max_body // mib} MiB for a Telegram webhook's body and "
            f"{WhatsAppTuning.max_body // mib} MiB for a WhatsApp one") in text


def heading_over_table(markdown: str, first_cell: str) -> str:
    """The nearest heading above the table whose first body cell is `first_cell`."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    heading = ""
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            heading = tokens[index + 1].content
        if token.type == "tbody_open" and tokens[index + 3].content == first_cell:
            return heading
    raise AssertionError(f"no table starts with {first_cell}")


def test_the_chat_commands_have_their_own_heading() -> None:
    readme = README.read_text("utf-8")
    assert heading_over_table(readme, "`/new`") == "Chat commands"
    assert heading_over_table(readme, "`roost init`") == "Commands"


def test_every_metric_is_in_the_metrics_table() -> None:
    from daemon.app.metrics import _HELP, Metrics

    exposed = {f"{family.name}_total" if family.type == "counter" else family.name
               for family in Metrics().registry.collect()} | set(_HELP)
    page = (DOCS / "how-it-works.md").read_text("utf-8")
    tokens = MarkdownIt("commonmark").enable("table").parse(page)
    documented: set[str] = set()
    for index, token in enumerate(tokens):
        if token.type == "td_open" and tokens[index - 1].type == "tr_open":
            documented.update(re.findall(r"`(roost_\w+)`", tokens[index + 1].content))
    assert len(exposed) > 15 and exposed - documented == set()
    assert documented - exposed == set()


def test_the_doctor_section_names_every_kind_of_check_doctor_prints() -> None:
    section = README.read_text("utf-8").partition("### Checking an installation")[2]
    section = " ".join(section.partition("\n## ")[0].split())
    # The check names doctor prints for WhatsApp, automations and the quarantine.
    for name in ("the `whatsapp` line", "for each automation, its next run", "`quarantine/`"):
        assert name in section
    assert "no checks" not in section


# ---- the README against the code, both ways ------------------------------------------------

def tokens() -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(README.read_text("utf-8"))


def tables_by_heading(parsed: list[Token]) -> list[tuple[str, list[list[str]]]]:
    """Each table's body rows (cell texts) with the heading it sits under."""
    found: list[tuple[str, list[list[str]]]] = []
    heading = ""
    rows: list[list[str]] = []
    for index, token in enumerate(parsed):
        if token.type == "heading_open":
            heading = parsed[index + 1].content
        elif token.type == "tbody_open":
            rows = []
            found.append((heading, rows))
        elif token.type == "tr_open" and found and found[-1][1] is rows:
            rows.append([])
        elif token.type == "inline" and parsed[index - 1].type == "td_open" and rows:
            rows[-1].append(token.content)
        elif token.type == "tbody_close":
            rows = []
    return found


def code_commands() -> set[str]:
    """`roost` commands as they are typed: `run`, `pairing approve`, from the parser itself."""
    def walk(parser: argparse.ArgumentParser, prefix: str) -> set[str]:
        names: set[str] = set()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    names |= walk(sub, f"{prefix}{name} ") or {prefix + name}
        return names
    return walk(build_parser(), "")


def documented_commands() -> set[str]:
    """The command words of each row of the Commands table (`roost pairing approve CODE`)."""
    (rows,) = [rows for heading, rows in tables_by_heading(tokens()) if heading == "Commands"]
    commands = set()
    for row in rows:
        words = re.fullmatch(r"`roost ([^`]*)`", row[0])
        assert words, row[0]
        commands.add(" ".join(itertools.takewhile(re.compile("[a-z][a-z-]*").fullmatch,
                                                  words[1].split())))
    return commands


def test_every_command_and_subcommand_has_a_row_and_every_row_is_a_command() -> None:
    code = code_commands()
    assert {"run", "init", "pairing approve", "automations remind"} <= code  # the walk works
    assert documented_commands() == code


def test_every_chat_command_is_documented_and_every_documented_one_exists() -> None:
    (rows,) = [rows for heading, rows in tables_by_heading(tokens())
               if heading == "Chat commands"]
    documented = {row[0].strip("`/").split()[0] for row in rows}  # `/forget N`: the word
    names = Commands.names | FactsCommands.names
    assert documented - names == set()
    readme = README.read_text("utf-8")
    assert all(re.search(rf"`/{name}[` ]", readme) for name in names)  # /start: under Telegram


def documented_keys() -> dict[str, set[str]]:
    """The key tables of the configuration reference, by the table their heading names."""
    section = README.read_text("utf-8").partition("<!-- config-reference:start -->")[2]
    section = section.partition("<!-- config-reference:end -->")[0]
    parsed = MarkdownIt("commonmark").enable("table").parse(section)
    keys: dict[str, set[str]] = {}
    for heading, rows in tables_by_heading(parsed):
        table = re.fullmatch(r"`(\[\[?[\w.]+\]\]?)`", heading)
        if table:
            keys[table[1]] = {re.sub(r"^`|`$", "", row[0]) for row in rows}
    return keys


def test_every_config_key_is_documented_and_every_documented_key_exists() -> None:
    code, documented = config_keys(), documented_keys()
    assert "[model]" in code and "[[automations]]" in code
    assert set(documented) == set(code)
    for table, keys in code.items():
        assert documented[table] == keys, table


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def parsed(page: Path) -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(page.read_text("utf-8"))


def anchors(page: Path) -> set[str]:
    tokens = parsed(page)
    return {slug(tokens[i + 1].content) for i, token in enumerate(tokens)
            if token.type == "heading_open"}


def links(page: Path) -> list[str]:
    return [str(child.attrs["href"]) for token in parsed(page) if token.type == "inline"
            for child in token.children or () if child.type == "link_open"]


def broken_links(page: Path) -> list[str]:
    """Links of `page` to a heading or a file of the repository that lead nowhere."""
    broken = []
    for href in links(page):
        if re.match(r"[a-z]+:", href):  # the web: not checked here
            continue
        path, _, fragment = href.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or (fragment and target.suffix == ".md"
                                   and fragment not in anchors(target)):
            broken.append(href)
    return broken


def test_every_link_of_the_readme_and_docs_leads_somewhere() -> None:
    assert docs_pages() and links(README)
    for page in [README, *docs_pages()]:
        assert broken_links(page) == [], page.name


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A part\n", "utf-8")
    page.write_text("# Here\n\n[a](#here) [b](other.md#a-part) [c](other.md#gone) "
                    "[d](missing.md) [e](#nowhere) [f](https://example.org/x)\n", "utf-8")
    assert broken_links(page) == ["other.md#gone", "missing.md", "#nowhere"]


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / href.partition("#")[0]).resolve() for href in links(README)
              if href.startswith("docs/")}
    assert {page.resolve() for page in docs_pages()} - linked == set()


def test_every_platform_has_the_file_set_docs_channels_names() -> None:
    """docs/channels.md's table is each platform's shape: every file it names is in every
    installed platform's folder, and its columns are the installed platforms."""
    page = (ROOT / "docs" / "channels.md").read_text("utf-8")
    rows = [line.split("|")[1:-1] for line in page.splitlines() if line.startswith("| `")]
    header = next(line for line in page.splitlines() if line.startswith("| file |"))
    titles = [cell.strip() for cell in header.split("|")[3:-1]]
    platforms = installed()
    assert titles == [platform.title for platform in platforms.values()]
    files = [cell[0].strip().strip("`") for cell in rows]
    assert "platform.py" in files and "channel.py" in files
    for name in platforms:
        assert [f for f in files if not (ROOT / "channels" / name / f).is_file()] == [], name
