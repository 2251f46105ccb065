"""Roost's children cannot read its secrets: a real child of a non-dumpable parent tries the
parent's /proc/<pid>/environ and the credentials directory (as a plain user: root could)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.core import confine

ROOT = Path(__file__).resolve().parents[3]

# The child: what a stdio MCP server of the same user could try.
CHILD = """
import json, os, sys
tried = {}
for name, path in (("environ", f"/proc/{os.getppid()}/environ"),
                   ("credential", sys.argv[1] + "/ROOST_TELEGRAM_TOKEN"),
                   ("beside", sys.argv[2])):
    try:
        with open(path, "rb") as f:
            tried[name] = f.read().decode(errors="replace")
    except OSError as exc:
        tried[name] = "refused: " + exc.strerror
print(json.dumps(tried))
"""

# The parent: roost's start, then a child started as roost starts its children.
PARENT = """
import subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from daemon.core import confine
assert confine.undumpable()
assert confine.hide(Path(sys.argv[2]))
argv = confine.wrapped([sys.executable, "-c", sys.argv[3], sys.argv[2], sys.argv[4]])
sys.exit(subprocess.run(argv).returncode)
"""


def readable_copy(folder: Path) -> Path:
    """The modules the parent imports, copied under `folder`: run as a plain user, it may not
    read this checkout (a clone in a private home), and the test must not open that up."""
    source = folder / "src"
    for module in ("daemon/__init__.py", "daemon/core/__init__.py", "daemon/core/confine.py"):
        (source / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / module, source / module)
    return source


@pytest.fixture
def folder() -> Iterator[Path]:
    made = Path(tempfile.mkdtemp(prefix="roost-confine-", dir="/tmp"))
    yield made
    shutil.rmtree(made)


def test_a_child_reads_neither_the_parents_environment_nor_the_credentials(
        folder: Path) -> None:
    if not sys.platform.startswith("linux") or confine.landlock_abi() < 2:
        pytest.skip("needs Linux with Landlock ABI 2 (5.19+)")
    credentials = folder / "home" / ".config" / "roost" / "credentials"
    credentials.mkdir(parents=True)
    (credentials / "ROOST_TELEGRAM_TOKEN").write_text("123:SECRET-FROM-FILE")
    beside = folder / "home" / ".config" / "other.txt"
    beside.write_text("readable")
    python, user, source = sys.executable, {}, readable_copy(folder)
    if os.getuid() == 0:  # root may read any process's environ: be a plain user, as roost is
        python = "/usr/bin/python3"
        if not Path(python).exists():
            pytest.skip("no system python to run as a plain user")
        for path in (folder, *folder.rglob("*")):
            os.chown(path, 65534, 65534)
        user = {"user": 65534, "group": 65534, "extra_groups": []}
    env = {"PATH": os.defpath, "ROOST_TELEGRAM_TOKEN": "123:SECRET-FROM-ENV"}
    done = subprocess.run([python, "-I", "-c", PARENT, str(source), str(credentials), CHILD,
                           str(beside)], env=env, capture_output=True, text=True,
                          timeout=60, cwd="/", **user)  # type: ignore[call-overload]
    assert done.returncode == 0, done.stderr
    tried = json.loads(done.stdout)
    assert tried["environ"].startswith("refused"), tried
    assert tried["credential"].startswith("refused"), tried
    assert tried["beside"] == "readable"  # the rest of the disk stays as it was


def test_a_command_that_is_not_found_is_left_for_the_caller_to_report() -> None:
    assert confine.wrapped(["/nonexistent/mcp-server", "--x"]) == ["/nonexistent/mcp-server",
                                                                    "--x"]
