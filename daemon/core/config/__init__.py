"""TOML file + environment secrets -> typed, validated, frozen settings.

The file is read once, here; every other module gets a `Settings` passed down. Each table is
checked against a small spec (key -> converter), so an unknown key, a wrong type or a bad value
becomes a `ConfigError` that names the dotted key and the file. Secrets never come from the file:
they are read from the environment or from systemd credentials (`$CREDENTIALS_DIRECTORY/<NAME>`),
else from the folder `roost init` writes them to (`credentials_dir`).

A package, one module per group of tables: `sections` (the plain tables), `automations`, `mcp`,
`identities` (and `[people.NAME]`); `values` (the converters every spec uses), `credentials`
(where the file and the secrets are) and `load` (the file read into one `Settings`). Import from
here.
"""

from daemon.core.config.automations import AutomationSettings, target_person
from daemon.core.config.credentials import (
    SECRETS,
    SYSTEM_CONFIG,
    SYSTEM_CREDENTIALS,
    credentials_dir,
    read_secret,
)
from daemon.core.config.identities import (
    GUEST,
    GUEST_DAILY_MESSAGES,
    MEMBER,
    OWNER,
    ROLES,
    PersonSettings,
)
from daemon.core.config.load import (
    Settings,
    config_keys,
    find_config_path,
    load_settings,
    missing_secrets,
    parse_duration,
)
from daemon.core.config.mcp import BUILTIN_CAPABILITIES, McpServerSettings, McpSettings
from daemon.core.config.sections import (
    DEFAULT_HOST,
    OLLAMA_WEB_SEARCH,
    AccessSettings,
    AttachmentSettings,
    ConsoleSettings,
    DaemonSettings,
    ModelSettings,
    SpeechSettings,
    VoiceSettings,
    WebSettings,
)
from daemon.core.errors import ConfigError

__all__ = [
    "BUILTIN_CAPABILITIES",
    "DEFAULT_HOST",
    "GUEST",
    "GUEST_DAILY_MESSAGES",
    "MEMBER",
    "OLLAMA_WEB_SEARCH",
    "OWNER",
    "ROLES",
    "SECRETS",
    "SYSTEM_CONFIG",
    "SYSTEM_CREDENTIALS",
    "AccessSettings",
    "AttachmentSettings",
    "AutomationSettings",
    "ConfigError",
    "ConsoleSettings",
    "DaemonSettings",
    "McpServerSettings",
    "McpSettings",
    "ModelSettings",
    "PersonSettings",
    "Settings",
    "SpeechSettings",
    "VoiceSettings",
    "WebSettings",
    "config_keys",
    "credentials_dir",
    "find_config_path",
    "load_settings",
    "missing_secrets",
    "parse_duration",
    "read_secret",
    "target_person",
]
