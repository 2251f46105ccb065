"""What `roost init` writes (the config, the secrets as credential files, the user unit) and
the flags that say it: light imports only, since the `roost` parser is built from them.

Kept apart from the questions (cli/init.py) so that each file's place and mode is in one spot:
the config 0600 where roost looks, each secret a 0600 file named like its variable in a 0700
folder, which is where the units' `LoadCredential=` lines read them (systemd/*.service).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from daemon.core.config import SYSTEM_CONFIG, SYSTEM_CREDENTIALS

DEFAULT_OLLAMA = "http://127.0.0.1:11434"
DEFAULT_API_BASE = "https://api.telegram.org/bot"
DEFAULT_GRAPH = "https://graph.facebook.com"
SYSTEM_STATE = Path("/var/lib/roost")  # the system unit's StateDirectory=roost


@dataclass(frozen=True)
class Answers:
    """Everything init learned; what the config and the credential files are made of."""

    ollama_url: str
    model: str
    api_base: str = DEFAULT_API_BASE
    webhook_url: str | None = None
    whatsapp_phone_number_id: str | None = None
    whatsapp_api_base: str = DEFAULT_GRAPH
    secrets: Mapping[str, str] = field(default_factory=dict)  # variable name -> value
    whatsapp_owner: str | None = None  # the owner's wa_id: in whatsapp.allow, never paired


def config_home(env: Mapping[str, str]) -> Path:
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return Path(env.get("XDG_CONFIG_HOME") or home / ".config")


def default_config(env: Mapping[str, str], root: bool) -> Path:
    """Where roost looks: /etc/roost for root (the system unit), else the user's config."""
    return SYSTEM_CONFIG if root else config_home(env) / "roost" / "roost.toml"


def default_credentials(env: Mapping[str, str], root: bool) -> Path:
    """The folder the unit's LoadCredential= lines name (systemd/roost*.service)."""
    return SYSTEM_CREDENTIALS if root else config_home(env) / "roost" / "credentials"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(answers: Answers) -> str:
    """The TOML text: only what differs from the defaults, so the README's reference explains
    the rest (roost.example.toml has every key)."""
    lines = ["# Written by `roost init`; every key: roost.example.toml or README.md "
             "(Configuration).", "# Secrets are not here: they are files in the credentials "
             "folder (README.md, Secrets).", "", "[model]"]
    if answers.ollama_url.rstrip("/") != DEFAULT_OLLAMA:
        lines.append(f"host = {_quote(answers.ollama_url.rstrip('/'))}")
    lines += [f"name = {_quote(answers.model)}", "", "[telegram]", "enabled = true"]
    if answers.webhook_url:
        lines += ['mode = "webhook"', f"webhook_url = {_quote(answers.webhook_url)}"]
    else:
        lines.append('mode = "polling"')
    if answers.api_base != DEFAULT_API_BASE:
        lines.append(f"api_base = {_quote(answers.api_base)}")
    if answers.whatsapp_phone_number_id:
        lines += ["", "[whatsapp]", "enabled = true",
                  f"phone_number_id = {_quote(answers.whatsapp_phone_number_id)}"]
        if answers.whatsapp_api_base != DEFAULT_GRAPH:
            lines.append(f"api_base = {_quote(answers.whatsapp_api_base)}")
        if answers.whatsapp_owner:
            lines.append(f"allow = [{_quote(answers.whatsapp_owner)}]")
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str) -> None:
    """Create or replace `path` with mode 0600 (its folder 0700 if init makes it)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_credentials(folder: Path, secrets: Mapping[str, str]) -> list[Path]:
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)
    written = []
    for name, value in secrets.items():
        write_private(folder / name, value)
        written.append(folder / name)
    return written


def unit_template() -> Path | None:
    """systemd/roost-user.service of the checkout roost runs from (or the working directory:
    `pip install .` copies the packages, not the unit files)."""
    for top in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (top / "systemd" / "roost-user.service").is_file():
            return top / "systemd" / "roost-user.service"
    return None


def roost_command(env: Mapping[str, str]) -> str:
    """How to start this roost from the user's shell: `roost` when PATH finds this one, else
    its full path (after the Quick start the venv is not on PATH), else `python -m daemon`."""
    script = Path(sys.executable).parent / "roost"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m daemon"
    found = shutil.which("roost", path=env.get("PATH", ""))
    if found and Path(found).resolve() == script.resolve():
        return "roost"
    return shlex.quote(str(script))


def render_user_unit(template: str, config: Path, credentials: Path, secrets: list[str]) -> str:
    """The user unit for this install: this interpreter's roost, this config, and the
    LoadCredential= lines of the secrets init wrote uncommented."""
    roost = Path(sys.executable).parent / "roost"
    text = re.sub(r"(?m)^ExecStart=.*$", f"ExecStart={roost} run --config {config}", template)
    for name in secrets:
        text = re.sub(rf"(?m)^#LoadCredential={name}:.*$",
                      f"LoadCredential={name}:{credentials / name}", text)
    return text


def system_unit_commands(config: Path, credentials: Path, secrets: list[str]) -> list[str]:
    """What root runs to install and start the system unit (init never runs systemctl as root:
    the unit's paths under /opt/roost are the README's; the owner checks them first)."""
    lines = "".join(f"\\nLoadCredential={name}:{credentials / name}" for name in secrets)
    return [
        "sudo install -Dm644 /opt/roost/systemd/roost.service /etc/systemd/system/roost.service",
        "sudo mkdir -p /etc/systemd/system/roost.service.d",
        f"printf '[Service]{lines}\\n' | sudo tee "
        "/etc/systemd/system/roost.service.d/credentials.conf >/dev/null",
        f"sudo CREDENTIALS_DIRECTORY={credentials} STATE_DIRECTORY={SYSTEM_STATE} "
        f"/opt/roost/.venv/bin/roost doctor --config {config}",
        "sudo systemctl daemon-reload && sudo systemctl enable --now roost",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--non-interactive", action="store_true",
                        help="ask nothing: take every answer from the flags and environment")
    parser.add_argument("--force", action="store_true", help="replace an existing config")
    parser.add_argument("--ollama-url", metavar="URL",
                        help=f"Ollama's address (default {DEFAULT_OLLAMA})")
    parser.add_argument("--model", help="the model to talk to (default: the first pulled one "
                                        "with tools)")
    parser.add_argument("--token-file", type=Path, metavar="PATH",
                        help="a file holding the bot token (else $ROOST_TELEGRAM_TOKEN)")
    parser.add_argument("--telegram-api-base", metavar="URL", default=DEFAULT_API_BASE,
                        help="the Bot API's base URL (a local Bot API server)")
    parser.add_argument("--webhook-url", metavar="URL",
                        help="the public HTTPS URL of /webhooks/telegram (default: polling)")
    parser.add_argument("--whatsapp-phone-number-id", metavar="ID",
                        help="set up WhatsApp too; its three secrets from $ROOST_WHATSAPP_TOKEN, "
                             "$ROOST_WHATSAPP_APP_SECRET and $ROOST_WHATSAPP_VERIFY_TOKEN")
    parser.add_argument("--whatsapp-owner", metavar="NUMBER",
                        help="your own WhatsApp number with its country code: roost answers "
                             "it without pairing (whatsapp.allow)")
    parser.add_argument("--whatsapp-api-base", metavar="URL", default=DEFAULT_GRAPH,
                        help="the Graph API's base URL")
    parser.add_argument("--credentials-dir", type=Path, metavar="PATH",
                        help="where the secrets go (default ~/.config/roost/credentials, "
                             "/etc/roost/credentials for root)")
    parser.add_argument("--state-dir", type=Path, metavar="PATH",
                        help="the state directory the pairing is written to (default: the "
                             "config's; /var/lib/roost for /etc/roost/roost.toml)")
    parser.add_argument("--pair-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="how long to wait for /start (default 300; 0 skips pairing)")
    parser.add_argument("--no-service", action="store_true",
                        help="do not install the user unit; print the commands instead")
