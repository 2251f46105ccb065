"""Every process roost starts gets an environment built by `daemon.core.child_env`, never
roost's own (which holds the channels' tokens): this reads the source of daemon/, channels/
and automations/ and lists every place a process is started.

A call that starts a process must pass `env=child_env(...)`, or `env=NAME` where NAME was
assigned `child_env(...)` in the same function. Ways of starting one that take no environment
(`os.system`, `os.popen`, `os.spawn*`, `os.exec*`, `pty.spawn`) are refused, except where
`EXEC_IN_PLACE` says why one is safe.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_import_rules import PACKAGES, ROOT

# Calls that start a process and take an `env`, whatever module they come from.
STARTERS = {"create_subprocess_exec", "create_subprocess_shell", "Popen", "open_process",
            "run_process", "subprocess_exec", "subprocess_shell", "StdioServerParameters"}
# subprocess's shortcuts, whose names mean something else elsewhere (`asyncio.run`).
SUBPROCESS_SHORTCUTS = {"run", "call", "check_call", "check_output"}
# Calls that start a process without taking an `env` at all.
NO_ENV = {("os", "system"), ("os", "popen"), ("pty", "spawn"), ("subprocess", "getoutput"),
          ("subprocess", "getstatusoutput")}
NO_ENV_PREFIXES = {("os", "spawn"), ("os", "exec"), ("os", "posix_spawn")}
BUILDER = "child_env"
# (file, function): a process that replaces itself keeps the environment it was started with.
EXEC_IN_PLACE = {
    # confine's launcher becomes the real command after Landlock; it was itself started with
    # an environment from child_env (by the MCP connection or the document pool).
    ("daemon/core/confine.py", "_launch"),
}


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _called(node: ast.Call) -> tuple[str | None, str]:
    """(receiver, name) of `receiver.name(...)`, or (None, name) of `name(...)`."""
    func = node.func
    if isinstance(func, ast.Attribute):
        receiver = func.value.id if isinstance(func.value, ast.Name) else None
        return receiver, func.attr
    if isinstance(func, ast.Name):
        return None, func.id
    return None, ""


def _builds_env(value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and _called(value)[1] == BUILDER


def _env_is_built(call: ast.Call, function: ast.AST | None) -> bool:
    env = next((k.value for k in call.keywords if k.arg == "env"), None)
    if env is None:
        return False
    if _builds_env(env):
        return True
    if isinstance(env, ast.Name) and function is not None:
        return any(isinstance(n, ast.Assign) and _builds_env(n.value)
                   and any(isinstance(t, ast.Name) and t.id == env.id for t in n.targets)
                   for n in ast.walk(function))
    return False


def _imported_from_subprocess(tree: ast.Module) -> set[str]:
    return {alias.asname or alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "subprocess"
            for alias in node.names}


def _functions(tree: ast.Module) -> Iterator[tuple[ast.AST | None, ast.Call]]:
    """Every call with the function it is in (None at module level)."""
    def visit(node: ast.AST, function: ast.AST | None) -> Iterator[tuple[ast.AST | None,
                                                                        ast.Call]]:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) \
                else function
            if isinstance(child, ast.Call):
                yield function, child
            yield from visit(child, inner)
    yield from visit(tree, None)


def starts(text: str, name: str) -> Iterator[tuple[str, int, str, bool]]:
    """(file, line, what is called, whether its environment is built by child_env) of the
    source `text` of file `name`."""
    tree = ast.parse(text)
    from_subprocess = _imported_from_subprocess(tree)
    for function, call in _functions(tree):
        receiver, called = _called(call)
        where = getattr(function, "name", "")
        shown = f"{receiver}.{called}" if receiver else called
        if called in STARTERS or (receiver == "subprocess" and called in SUBPROCESS_SHORTCUTS) \
                or (receiver is None and called in from_subprocess & SUBPROCESS_SHORTCUTS):
            yield name, call.lineno, shown, _env_is_built(call, function)
        elif (receiver, called) in NO_ENV or any(
                receiver == r and called.startswith(p) for r, p in NO_ENV_PREFIXES):
            yield name, call.lineno, shown, (name, where) in EXEC_IN_PLACE


def test_every_child_process_gets_an_environment_from_the_allow_list() -> None:
    found = [start for path in sources()
             for start in starts(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    bare = [f"{file}:{line}: {what}" for file, line, what, built in found if not built]
    assert not bare, ("processes started without env=child_env(...) "
                      "(daemon/core/child_env.py):\n" + "\n".join(bare))
    # The scan sees the children roost is known to start (if it sees none, it is broken).
    seen = {file for file, *_ in found}
    assert {"daemon/voice/speech_backends.py", "daemon/parsing/pool.py",
            "daemon/tools/mcp/connection.py", "daemon/cli/init.py"} <= seen, seen


def test_the_scan_tells_a_built_environment_from_a_missing_or_inherited_one() -> None:
    text = ("import asyncio, os, subprocess\n"
            "from subprocess import check_output\n"
            "async def f(env):\n"
            "    await asyncio.create_subprocess_exec('x')\n"
            "    subprocess.run(['x'], env=env)\n"
            "    asyncio.run(f(None))\n"
            "def g():\n"
            "    env = child_env()\n"
            "    subprocess.Popen(['x'], env=env)\n"
            "    StdioServerParameters(command='x', env=child_env({'A': 'b'}))\n"
            "    check_output(['x'], env=dict(os.environ))\n"
            "    os.execvp('x', ['x'])\n")
    assert [(line, what, built) for _, line, what, built in starts(text, "daemon/x.py")] == [
        (4, "asyncio.create_subprocess_exec", False),
        (5, "subprocess.run", False),
        (9, "subprocess.Popen", True),
        (10, "StdioServerParameters", True),
        (11, "check_output", False),
        (12, "os.execvp", False)]
