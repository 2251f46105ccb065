"""Where the config file and the secrets are: secrets come from the environment or
systemd's credentials, never from the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from daemon.core.errors import ConfigError

SYSTEM_CONFIG = Path("/etc/roost/roost.toml")
SYSTEM_CREDENTIALS = Path("/etc/roost/credentials")

# Environment variable (and credential file) name of each secret, per table; a platform's are
# in its description (daemon/core/platforms.py).
SECRETS: Mapping[str, Mapping[str, str]] = {
    "voice": {"key": "ROOST_VOICE_KEY"},
    "speech": {"key": "ROOST_SPEECH_KEY"},
    "web": {"ollama_api_key": "ROOST_OLLAMA_API_KEY"}}


def credentials_dir(env: Mapping[str, str], config: Path | None = None) -> Path:
    """Where secrets are files: systemd's $CREDENTIALS_DIRECTORY when it is set, else the folder
    `roost init` writes them to, so a plain `roost run` right after init finds them:
    /etc/roost/credentials for the system config, ~/.config/roost/credentials otherwise."""
    if env.get("CREDENTIALS_DIRECTORY"):
        return Path(env["CREDENTIALS_DIRECTORY"])
    if config is not None and config.absolute() == SYSTEM_CONFIG:
        return SYSTEM_CREDENTIALS
    return _config_home(env) / "roost" / "credentials"


def read_secret(name: str, env: Mapping[str, str], config: Path | None = None) -> str | None:
    """A secret from the environment, else from its file in `credentials_dir`."""
    if value := env.get(name, "").strip():
        return value
    path = credentials_dir(env, config) / name
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(name, f"cannot read the credential: {error}", str(path)) from None


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _config_home(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CONFIG_HOME") or _home(env) / ".config")
