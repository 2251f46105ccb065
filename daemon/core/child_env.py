"""The environment of every process roost starts: built from an allow list, never inherited.

roost's own environment holds its secrets (`ROOST_TELEGRAM_TOKEN`, `ROOST_WHATSAPP_*`, ...) and
what systemd hands the service alone (`CREDENTIALS_DIRECTORY`, `NOTIFY_SOCKET`, `LISTEN_FDS`,
`STATE_DIRECTORY`, ...). roost makes itself undumpable, but a program it execs is not: any
process of the same user can read `/proc/<child>/environ` while the child runs. So no child
inherits `os.environ`; each gets `child_env(...)`: the names in `ALLOWED` (and `LC_*`) that
roost has, the caller's `keep` (names a program needs beyond those, such as the bus address of
`systemctl --user`), then the caller's `extra` (an MCP server's configured `env`, the document
worker's `PYTHONPATH`), which wins.

What is allowed is what a program needs to find itself and its files and to speak the user's
language: no value here is a credential. Proxy settings are left out on purpose (a proxy URL
often carries a password): a server that needs one is given it in its own `env`.

`tests/test_child_processes.py` reads the source and fails on any process started without an
environment built here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

ALLOWED = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM",
    "LANG", "LANGUAGE", "TZ", "TMPDIR",
    # Where a program keeps its caches and settings (npx, uvx and pip fetch servers there).
    "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
    # A private CA the user installed, for a server that calls out over TLS.
    "SSL_CERT_FILE", "SSL_CERT_DIR",
    # Where Python keeps bytecode, or that it keeps none: a Python child (the document worker,
    # a Python MCP server) then leaves a read-only or clean source tree as the user asked.
    "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX",
)
ALLOWED_PREFIXES = ("LC_",)


def child_env(extra: Mapping[str, str] | None = None, *, keep: Iterable[str] = (),
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: the allowed names of `environ` (roost's own by default)
    and `keep`, then `extra` on top."""
    source = os.environ if environ is None else environ
    wanted = set(ALLOWED) | set(keep)
    env = {name: value for name, value in source.items()
           if (name in wanted or name.startswith(ALLOWED_PREFIXES))
           # An exported shell function ("() { ...") is code for the child's shell, not a
           # setting: the MCP SDK drops those as well.
           and not value.startswith("()")}
    env.update(extra or {})
    return env
