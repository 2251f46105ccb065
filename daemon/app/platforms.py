"""The runtime of an installed platform, loaded when the daemon runs it.

A platform's description (channels/<name>/platform.py) is light, so every command can read the
config; its runtime (python-telegram-bot, matrix-nio, ...) is imported only here, by the module
name the description gives (tests/test_import_rules.py holds each to the app's import rules).
"""

from __future__ import annotations

import importlib

from daemon.core.errors import ConfigError
from daemon.core.platforms import Platform
from daemon.intake.platforms import Runtime


def runtime_of(platform: Platform[object]) -> Runtime:
    """ConfigError when a library the platform needs is not installed (an optional extra)."""
    try:
        runtime: Runtime = importlib.import_module(platform.runtime).RUNTIME
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("channels", "daemon"):
            raise
        raise ConfigError(f"{platform.name}.enabled", f"needs {exc.name}, which is not "
                          f"installed: pip install 'roost[{platform.name}]'") from None
    return runtime
