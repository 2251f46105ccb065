"""Imports point one way: down the flow, never back up (docs/developing.md).

A layer may import only the layers listed for it in `ALLOWED` (and itself). An import inside a
function or class body counts as well, and is reported on its own: hiding an import there to
dodge a cycle is an arrow pointing up that only shows at run time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from daemon.cli.main import _HEAVY
from daemon.core.platforms import installed

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("daemon", "channels", "automations")

_MIDDLE = {"core", "context", "parsing", "store", "llm", "tools", "intake", "turn", "voice",
           "engine", "console"}
# What each layer may import besides itself. Lowest first; "daemon" is the package root
# (daemon/__init__.py: the version; daemon/__main__.py: `python -m daemon`).
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "context": {"core"},
    # Documents and pages read in sandboxed worker processes; nothing of roost's state.
    "parsing": {"core"},
    # A stored document's note holds what it says (parsed on the way in).
    "store": {"core", "parsing"},
    "llm": {"core"},
    "tools": {"core", "context", "parsing", "store"},
    "intake": {"core", "store"},
    "turn": {"core", "context", "parsing", "store", "llm", "tools"},
    # Transcription knows the store's attachments; the model's slot is handed to it.
    "voice": {"core", "store"},
    # The web console shows what the store, the pairing book and the recall scope know; it
    # neither runs turns nor calls the model.
    "console": {"core", "context", "store", "intake", "tools"},
    "engine": {"core", "context", "parsing", "store", "llm", "tools", "intake", "turn",
               "voice"},
    # `roost models`: probes the model server and keeps its cards; no turn, no channel.
    "models": {"core", "context", "store", "llm"},
    # A channel verifies, parses, admits and translates: it never reaches the engine or the model.
    "channels": {"core", "intake", "store"},
    "automations": _MIDDLE,
    # Only the composition roots import channels and automations.
    # ...and the model cards the turns act on (daemon/models/book.py).
    "app": _MIDDLE | {"channels", "automations", "daemon", "models"},
    "cli": _MIDDLE | {"channels", "automations", "daemon", "app", "models"},
    "daemon": {"cli"},
}

# Arrows that still point up, as (module, imported), each with the issue item that removes it.
# Empty since the layout moves of issue 19 item 1; keep it so. A coupling that is not an import
# and so not checked here: the Ollama client drives "typing" through a context variable (item 3).
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

# An import whose module name is not written where it happens (`import_module(name)`) hides
# what it imports from this check, so it is refused as well, except in this one place: the
# `roost` command loads the module behind a heavy subcommand (run, chat, doctor, automations)
# only when that subcommand runs, so that `roost --version` does not import aiohttp and the
# engine (issue 20 item 6). Its table of module names is checked against the rules below.
# The daemon loads an installed platform's runtime (python-telegram-bot, matrix-nio) by the
# module name its light description gives, for the same reason (issue 47): every command reads
# the config, which needs each platform's description, not its runtime.
DYNAMIC = "<a name computed at run time>"
LAZY_LOADERS: set[tuple[str, str]] = {("daemon.cli.main", DYNAMIC),
                                      ("daemon.app.platforms", DYNAMIC)}
# The list of installed platforms imports each platform's description, and nothing else of it.
INSTALLED = "channels.installed"


def layer_of(module: str) -> str | None:
    """`daemon.turn.runner` -> `turn`; `channels.telegram.channel` -> `channels`."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    if parts[0] != "daemon":
        return parts[0]
    if len(parts) == 1 or parts[1].startswith("__"):  # __init__'s names, __main__
        return "daemon"
    return parts[1]


# The platforms under channels/ (channels/telegram/, channels/whatsapp/). One never imports
# another, and the shared modules beside them (channels/webhooks.py, ...) import none: what two
# platforms share lives in channels/ itself, so no logic is copied or borrowed between them.
PLATFORMS = frozenset(p.parent.name for p in (ROOT / "channels").glob("*/__init__.py"))


def platform_of(module: str) -> str | None:
    """`channels.telegram.parse` -> `telegram`; None for a shared channel module."""
    parts = module.split(".")
    return parts[1] if parts[0] == "channels" and len(parts) > 1 and parts[1] in PLATFORMS \
        else None


@dataclass(frozen=True)
class Violation:
    module: str
    imported: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.imported} ({self.why})"


def _imports(tree: ast.Module, module: str) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, inside a function or class) for every import in the tree."""

    def visit(node: ast.AST, nested: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                         | ast.ClassDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno, nested
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: resolve against this module's package
                    base = module.split(".")[: -child.level]
                    target = ".".join([*base, child.module] if child.module else base)
                else:
                    target = child.module or ""
                if target in PACKAGES:  # `from daemon import search_index` names a module
                    for alias in child.names:
                        yield f"{target}.{alias.name}", child.lineno, nested
                else:
                    yield target, child.lineno, nested
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name | ast.Attribute)
                  and (child.func.id if isinstance(child.func, ast.Name) else child.func.attr)
                  in ("import_module", "__import__")
                  and child.args and isinstance(child.args[0], ast.Constant)
                  and isinstance(child.args[0].value, str)):
                yield child.args[0].value, child.lineno, True
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name | ast.Attribute)
                  and (child.func.id if isinstance(child.func, ast.Name) else child.func.attr)
                  in ("import_module", "__import__")):
                yield DYNAMIC, child.lineno, True
            yield from visit(child, inner)

    yield from visit(tree, False)


def check_source(module: str, source: str) -> list[Violation]:
    """The rule breaks in one module's source."""
    own = layer_of(module)
    assert own is not None, module
    found: list[Violation] = []
    for imported, line, nested in _imports(ast.parse(source), module):
        if imported == DYNAMIC:
            found.append(Violation(module, imported, line, "a module named at run time"))
            continue
        target = layer_of(imported)
        if target is None:
            continue  # the standard library or a dependency
        if nested:
            found.append(Violation(module, imported, line, "import inside a function or class"))
        elif target != own and target not in ALLOWED[own]:
            found.append(Violation(module, imported, line, f"{own} may not import {target}"))
        elif own == "channels" and (platform := platform_of(imported)) is not None \
                and platform != platform_of(module) \
                and not (module == INSTALLED and imported == f"channels.{platform}.platform"):
            found.append(Violation(module, imported, line, f"only channels/{platform} may "
                                   f"import channels/{platform}: share code in channels/"))
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_violations() -> list[Violation]:
    found: list[Violation] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += check_source(module_name(path), path.read_text(encoding="utf-8"))
    return found


def test_no_import_points_up() -> None:
    found = [v for v in all_violations()
             if (v.module, v.imported) not in KNOWN_VIOLATIONS | LAZY_LOADERS]
    assert found == [], "\n".join(map(str, found))


def test_the_lazily_loaded_command_modules_obey_the_cli_rules() -> None:
    assert _HEAVY, "the CLI's table of lazily loaded modules is gone: drop LAZY_LOADERS"
    for name in _HEAVY.values():
        assert (ROOT / (name.replace(".", "/") + ".py")).exists(), name
        layer = layer_of(name)
        assert layer is not None and layer in ALLOWED["cli"] | {"cli"}, name


def test_each_platform_runtime_obeys_the_app_rules() -> None:
    """What daemon/app/platforms.py loads by name is a channels module, as the app may import."""
    for platform in installed().values():
        assert (ROOT / (platform.runtime.replace(".", "/") + ".py")).exists(), platform.runtime
        layer = layer_of(platform.runtime)
        assert layer == "channels" and platform_of(platform.runtime) == platform.name


def test_the_list_of_installed_platforms_imports_only_their_descriptions() -> None:
    source = "from channels.telegram.channel import Telegram\n"
    (violation,) = check_source(INSTALLED, source)
    assert "only channels/telegram may import" in str(violation)
    assert check_source(INSTALLED, "from channels.telegram.platform import TELEGRAM\n") == []


def test_a_module_named_at_run_time_is_reported() -> None:
    source = ("import importlib\n"
              "NAMES = {'x': 'daemon.engine.workers'}\n"
              "def load(n: str) -> None:\n"
              "    importlib.import_module(NAMES[n])\n")
    (violation,) = check_source("daemon.store.event_log", source)
    assert violation.imported == DYNAMIC and violation.line == 4


def test_the_allow_list_holds_only_violations_that_still_exist() -> None:
    still = {(v.module, v.imported) for v in all_violations()}
    assert KNOWN_VIOLATIONS | LAZY_LOADERS <= still, (KNOWN_VIOLATIONS | LAZY_LOADERS) - still


def test_every_layer_on_disk_has_rules() -> None:
    layers = {layer_of(module_name(p)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    assert layers <= ALLOWED.keys(), layers - ALLOWED.keys()


def test_an_arrow_pointing_up_is_reported() -> None:
    source = "from daemon.engine.workers import Engine\nfrom daemon.store import Store\n"
    (violation,) = check_source("daemon.store.event_log", source)
    assert violation.imported == "daemon.engine.workers"
    assert violation.line == 1
    assert "store may not import engine" in str(violation)


def test_a_channel_reaching_the_model_is_reported() -> None:
    source = ("from daemon.intake.durable import Intake\n"
              "from daemon.llm.client import ModelClient\n"
              "from channels.formatting import split_text\n")
    assert [v.imported for v in check_source("channels.telegram.channel", source)] == [
        "daemon.llm.client"]


def test_a_channel_borrowing_from_another_is_reported() -> None:
    borrowed = "from channels.telegram.parse import too_deep\n"
    (violation,) = check_source("channels.whatsapp.channel", borrowed)
    assert "only channels/telegram may import channels/telegram" in str(violation)
    (violation,) = check_source("channels.webhooks", borrowed)  # shared code imports no platform
    assert violation.imported == "channels.telegram.parse"
    assert check_source("channels.telegram.intake", borrowed) == []
    assert check_source("channels.whatsapp.channel", "from channels.webhooks import too_deep\n"
                        ) == []


def test_only_app_and_cli_import_channels_and_automations() -> None:
    source = "from channels.telegram.channel import Telegram\nimport automations.scheduler\n"
    assert check_source("daemon.app.serve", source) == []
    assert check_source("daemon.cli.main", source) == []
    assert len(check_source("daemon.engine.workers", source)) == 2
    assert len(check_source("automations.runner", "from channels.console import CHAT_KEY\n")) == 1


def test_an_import_hidden_in_a_function_is_reported() -> None:
    source = ("def later() -> None:\n"
              "    from daemon.store import Store\n"
              "async def sooner() -> None:\n"
              "    importlib.import_module('daemon.core.ids')\n")
    found = check_source("daemon.engine.workers", source)
    assert [(v.imported, v.line) for v in found] == [("daemon.store", 2), ("daemon.core.ids", 4)]
    assert all("inside a function" in v.why for v in found)


def test_from_package_import_module_is_seen() -> None:
    (violation,) = check_source("daemon.core.conversations", "from daemon import search_index\n")
    assert violation.imported == "daemon.search_index"
