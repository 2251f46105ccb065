"""The README's test command, run as a new user would: in a copy of the repository that sits
nowhere near this checkout (no sibling folders, no installed roost, a fresh virtual environment).

It proves the project carries every file its tests read and installs everything they need. The
copy runs the whole suite once; inside it this test skips itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INNER = "ROOST_FRESH_CLONE_INNER"
# Never copied: what a clone does not have (or what this checkout made while it ran).
_LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build",
                                   ".pytest_cache", ".ruff_cache", ".mypy_cache", "state")


def readme_test_command() -> str:
    """The second command of the README's Quick start: the one that runs the suite."""
    readme = (ROOT / "README.md").read_text("utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", quick_start, re.DOTALL)
    assert len(commands) == 2, "the Quick start has two commands"
    return commands[1]


def tracked_files() -> list[str] | None:
    """The files git tracks (what a clone gets), or None outside a git checkout."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True)
    return [name for name in listed.stdout.decode().split("\0") if name]


@pytest.mark.skipif(os.environ.get(INNER) == "1", reason="already inside the fresh copy")
def test_the_readme_test_command_passes_in_a_copy_far_from_this_checkout(
        tmp_path: Path) -> None:
    copy = tmp_path / "somewhere" / "else" / "roost"
    files = tracked_files()
    if files is None:
        shutil.copytree(ROOT, copy, ignore=_LEFT_OUT)
    else:
        for name in files:
            target = copy / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
    assert list(copy.parent.iterdir()) == [copy]  # no sibling folders to lean on
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTEST_", "VIRTUAL_ENV", "ROOST_"))}
    env[INNER] = "1"
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(Path(sys.executable).parent)))
    result = subprocess.run(["bash", "-c", readme_test_command()], cwd=copy, env=env,
                            capture_output=True, text=True, timeout=1200)
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
    assert result.returncode == 0, tail
    assert re.search(r"\d+ passed", result.stdout), tail
    assert " failed" not in result.stdout.splitlines()[-1], tail
