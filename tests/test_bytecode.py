"""PYTHONDONTWRITEBYTECODE is honoured: a test run with it set leaves no bytecode in the source
tree, neither from the session's compile-once step (tests/conftest.py) nor from a child roost
starts (daemon/core/child_env.py passes the setting on), and still compiles once for them all.

Run in a copy of the sources, so that this checkout's own caches neither hide nor cause it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The run inside the copy: a child started as roost starts its Python children imports a module
# nothing imported yet; the session's compiled modules are where the children look for them.
PROBE = '''
import subprocess, sys
from pathlib import Path

from daemon.core.child_env import child_env

ROOT = Path(__file__).resolve().parents[1]


def test_probe() -> None:
    assert sys.pycache_prefix and not Path(sys.pycache_prefix).is_relative_to(ROOT)
    assert list(Path(sys.pycache_prefix).rglob("confine*.pyc"))  # compiled once, up front
    subprocess.run([sys.executable, "-c", "import daemon.parsing.data"], check=True,
                   env=child_env({"PYTHONPATH": str(ROOT)}), cwd="/", timeout=120)
'''


def test_a_run_with_pythondontwritebytecode_writes_no_bytecode_beside_the_sources(
        tmp_path: Path) -> None:
    copy = tmp_path / "clone"
    caches = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", "llama")
    for package in ("daemon", "channels", "automations", "tests"):
        shutil.copytree(ROOT / package, copy / package, ignore=caches)
    shutil.copy(ROOT / "pyproject.toml", copy)
    (copy / "tests" / "test_probe_bytecode.py").write_text(PROBE, "utf-8")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTHONPYCACHEPREFIX", "PYTEST_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "tests/test_probe_bytecode.py"],
        cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*.pyc")) == []
