"""Keeping roost's secrets out of reach of the processes it starts (stdio MCP servers, document
workers), which run as the same user. Linux only; elsewhere every step is a no-op.

- `undumpable()`: prctl(PR_SET_DUMPABLE, 0). A process of the same user can then no longer read
  /proc/<roost>/environ, mem, fd/ or root/ (the kernel's ptrace access check), so the tokens in
  roost's environment stay there.
- `hide(folder)` then `wrapped(argv)`: a child is started through this file run as a script,
  which takes read access to `folder` (the credentials directory) away with Landlock (Linux
  5.19+, inherited by everything the child starts) and then execs the real command. Landlock
  only allows, so the rules allow reading everything beside the path down to the folder: every
  entry of / but the one leading to it, every entry of that one but the next, and so on.

Stdlib only: the launcher runs with `python -I` and must not need roost's packages.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every Linux arch
_VERSION = 1  # landlock_create_ruleset flag: ask for the ABI version
_PATH_BENEATH = 1
_READ_FILE = 1 << 2
_REFER = 1 << 13  # linking or renaming across directories (ABI 2): handled, or a hard link
# to a credential file from an allowed folder would be a way around the rules

_hidden: Path | None = None


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def undumpable() -> bool:
    """Make this process non-dumpable; whether it worked."""
    libc = _libc()
    return libc is not None and libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when there is none."""
    libc = _libc()
    if libc is None:
        return 0
    version = int(libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _VERSION))
    return max(version, 0)


def hide(folder: Path | None) -> bool:
    """Start children without read access to `folder` from now on; whether that is possible."""
    global _hidden
    if folder is None or not folder.is_dir() or landlock_abi() < 2:
        return False
    _hidden = folder.resolve()
    return True


def wrapped(argv: Sequence[str], path: str | None = None) -> list[str]:
    """`argv` to start with the hidden folder out of reach. Unchanged when nothing is hidden or
    the command is not found on `path` (so the caller's own "command not found" still shows)."""
    if _hidden is None or not argv or shutil.which(argv[0], path=path) is None:
        return list(argv)
    return [sys.executable, "-I", str(Path(__file__).resolve()), str(_hidden), "--", *argv]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _allowed(hidden: Path) -> list[tuple[str, bool]]:
    """(path, is a directory) of everything beside the way from / down to `hidden`."""
    found: list[tuple[str, bool]] = []
    for folder, step in zip(hidden.parents[::-1], hidden.parts[1:], strict=True):
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name == step:
                    continue
                try:
                    real = Path(os.path.realpath(entry.path))
                except OSError:
                    continue
                if real == hidden or real in hidden.parents or hidden in real.parents:
                    continue  # a link to the folder or to one of its parents would open it
                found.append((entry.path, real.is_dir()))
    return found


def restrict(hidden: Path) -> None:
    """Take read access to `hidden` away from this process and its children."""
    libc = _libc()
    if libc is None:
        raise OSError("not Linux")
    handled = ctypes.c_uint64(_READ_FILE | _REFER)
    ruleset = int(libc.syscall(_CREATE_RULESET, ctypes.byref(handled), ctypes.c_size_t(8), 0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path, is_dir in _allowed(hidden):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            rule = _PathBeneath(_READ_FILE | _REFER if is_dir else _READ_FILE, fd)
            try:
                if libc.syscall(_ADD_RULE, ruleset, _PATH_BENEATH, ctypes.byref(rule), 0) < 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
                libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _launch(args: list[str]) -> None:
    """`confine.py FOLDER -- COMMAND ARGS...`: restrict, then become COMMAND."""
    hidden, command = Path(args[0]), args[2:]
    try:
        restrict(hidden)
    except OSError as exc:  # nothing worse than before: say so on stderr (the server's log)
        print(f"roost: could not hide {hidden} from this process: {exc}", file=sys.stderr)
    os.execvp(command[0], command)


if __name__ == "__main__":
    _launch(sys.argv[1:])
