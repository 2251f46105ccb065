"""What a fresh clone needs for the README's test command to pass, checked in this checkout,
in well under a second: no second suite run in a copy.

CI (`.ci/run`) runs the README command itself, in a clean clone; these checks catch here, before
a commit, what would make that run fail where this checkout passes:

* a file the tests read that git does not track (a new fixture not added, or one that a
  `.gitignore` rule keeps out, such as a `roost.toml`);
* a module the tests (or the code they import) need that `pip install '.[test]'` does not
  install: a package not declared in pyproject.toml, nor pulled in by one that is;
* a README Quick start that says one thing while CI runs another.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
CACHES = ("__pycache__", ".pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache")


def readme_test_command() -> str:
    """The second command of the README's Quick start: the one that runs the suite."""
    readme = (ROOT / "README.md").read_text("utf-8")
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", quick_start, re.DOTALL)
    assert len(commands) == 2, "the Quick start has two commands"
    return str(commands[1])


def sources() -> list[Path]:
    """The tests and the packages pyproject installs (what the tests import of roost)."""
    packages = [name.rstrip("*")
                for name in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]]
    return [path for folder in ("tests", *packages)
            for path in sorted((ROOT / folder).rglob("*.py"))
            if not any(part in CACHES for part in path.parts)]


def imported(paths: list[Path]) -> set[str]:
    """Top-level names of every absolute import in `paths`."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def top_level_named_by_tests() -> set[str]:
    """Entries at the repository's top (`README.md`, `systemd`, ...) that a test names in a
    string or imports: what the tests may read outside tests/."""
    entries = {path.name for path in ROOT.iterdir()}
    named = {"tests"}
    for path in sources():
        if ROOT / "tests" not in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named.update({node.value} & entries)
    return named | (imported(sources()) & entries)


def git(command: str, *args: str) -> list[str]:
    """The paths `git <command> -z <args>` lists, caches left out."""
    listed = subprocess.run(["git", command, "-z", *args], cwd=ROOT, capture_output=True,
                            check=True)
    return [name for name in listed.stdout.decode().split("\0")
            if name and not any(cache in name for cache in CACHES)]


@pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None,
                    reason="not a git checkout: a clone is what this is")
def test_every_file_the_tests_read_is_tracked_by_git() -> None:
    named = sorted(top_level_named_by_tests())
    assert {"tests", "README.md", "systemd"} <= set(named)  # the check sees what tests read
    untracked = git("ls-files", "--others", "--exclude-standard", "--", *named)
    # Under tests/ an ignored file is as missing from a clone as an untracked one.
    ignored = git("ls-files", "--others", "--ignored", "--exclude-standard", "--", "tests")
    # Except the real model's engine, which .ci/run installs there (npm's node-llama-cpp): the
    # tier skips with one line without it, as a clone that never ran .ci/run has.
    ignored = [p for p in ignored if not p.startswith("tests/llama/node_modules/")]
    assert untracked + ignored == [], "a clone would not have these; git add them"


def installed_closure() -> set[str]:
    """The distributions `pip install '.[test]'` installs: what pyproject declares and,
    recursively, what those require (with the extras asked for, on this Python)."""
    project = PYPROJECT["project"]
    todo = [Requirement(r) for r in
            (*project["dependencies"], *project["optional-dependencies"]["test"])]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # declared but not installed here: the import check says which module
        for line in requires:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": extra})
                                            for extra in {"", *requirement.extras}):
                todo.append(needed)
    return seen


def test_pyproject_installs_every_package_the_tests_import() -> None:
    local = {path.name for path in ROOT.iterdir()}  # the copy has these (checked above)
    providers = importlib.metadata.packages_distributions()
    closure = installed_closure()
    third_party = sorted(name for name in imported(sources())
                         if name not in sys.stdlib_module_names and name not in local)
    assert "aiohttp" in third_party and "pytest" in third_party  # the scan sees imports
    missing = {name: providers.get(name, ["(no installed distribution)"])
               for name in third_party
               if not {canonicalize_name(d) for d in providers.get(name, [])} & closure}
    assert missing == {}, "imported, but not installed by pip install '.[test]'"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text("utf-8").splitlines()
    assert readme_test_command() in ci
