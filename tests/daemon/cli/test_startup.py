"""The `roost` command answers at once: importing it loads none of the heavy libraries, which
only the commands that use them (run, chat, doctor, automations) load (issue 20 item 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("aiohttp", "telegram", "ollama", "httpx", "apscheduler", "daemon.engine",
         "daemon.app.serve", "automations.commands")


def _loaded_after(code: str, modules: tuple[str, ...] = HEAVY) -> list[str]:
    probe = (f"import sys\n{code}\nimport json\n"
             f"print(json.dumps(sorted(m for m in {list(modules)!r} if m in sys.modules)))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout.splitlines()[-1])
    return loaded


def test_importing_the_cli_imports_no_heavy_library() -> None:
    assert _loaded_after("import daemon.cli.main") == []


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["run", "--help"]])
def test_version_and_help_import_no_heavy_library(argv: list[str]) -> None:
    code = ("import daemon.cli.main\n"
            "try:\n"
            f"    daemon.cli.main.main({argv!r})\n"
            "except SystemExit:\n"
            "    pass\n")
    assert _loaded_after(code) == []


@pytest.mark.parametrize("argv", [["pairing", "list"], ["conversations", "list"]])
def test_the_read_only_lists_import_no_heavy_library(argv: list[str], tmp_path: Path) -> None:
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n')
    code = ("import daemon.cli.main\n"
            f"assert daemon.cli.main.main({[*argv, '--config', str(config)]!r}) == 0\n")
    assert _loaded_after(code) == []


@pytest.mark.parametrize("servers", [0, 1])
def test_the_mcp_sdk_is_imported_only_with_a_server_configured(
    servers: int, tmp_path: Path
) -> None:
    """`import mcp` takes about 0.6 s: a third of what `roost run` or `roost doctor` took to
    start, paid by every install without an MCP server."""
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      '[model]\nhost = "http://127.0.0.1:9"\n'
                      + '[mcp.servers.notes]\ncommand = "/nonexistent/server"\n'
                      * servers)
    code = ("import daemon.cli.main, daemon.app.serve\n"
            f"daemon.cli.main.main(['doctor', '--config', {str(config)!r}])\n")
    assert _loaded_after(code, ("mcp",)) == (["mcp"] if servers else [])
