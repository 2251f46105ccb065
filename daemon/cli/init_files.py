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
from daemon.core.platforms import installed
from daemon.core.setup import Value, toml_value

DEFAULT_OLLAMA = "http://127.0.0.1:11434"
SYSTEM_STATE = Path("/var/lib/roost")  # the system unit's StateDirectory=roost


@dataclass(frozen=True)
class Answers:
    """Everything init learned; what the config and the credential files are made of."""

    ollama_url: str
    model: str
    # Each platform set up: its table's keys besides `enabled` (daemon/core/setup.py's SetUp).
    platforms: Mapping[str, Mapping[str, Value]] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)  # variable name -> value


def config_home(env: Mapping[str, str]) -> Path:
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    return Path(env.get("XDG_CONFIG_HOME") or home / ".config")


def default_config(env: Mapping[str, str], root: bool) -> Path:
    """Where roost looks: /etc/roost for root (the system unit), else the user's config."""
    return SYSTEM_CONFIG if root else config_home(env) / "roost" / "roost.toml"


def default_credentials(env: Mapping[str, str], root: bool) -> Path:
    """The folder the unit's LoadCredential= lines name (systemd/roost*.service)."""
    return SYSTEM_CREDENTIALS if root else config_home(env) / "roost" / "credentials"


def render_config(answers: Answers) -> str:
    """The TOML text: only what differs from the defaults, so the README's reference explains
    the rest (roost.example.toml has every key)."""
    lines = ["# Written by `roost init`; every key: roost.example.toml or README.md "
             "(Configuration).", "# Secrets are not here: they are files in the credentials "
             "folder (README.md, Secrets).", "", "[model]"]
    if answers.ollama_url.rstrip("/") != DEFAULT_OLLAMA:
        lines.append(f"host = {toml_value(answers.ollama_url.rstrip('/'))}")
    lines.append(f"name = {toml_value(answers.model)}")
    for name, table in answers.platforms.items():
        lines += ["", f"[{name}]", "enabled = true"]
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
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
    LoadCredential= lines of the secrets init wrote uncommented (added after the others for a
    secret the template does not list)."""
    roost = Path(sys.executable).parent / "roost"
    text = re.sub(r"(?m)^ExecStart=.*$", f"ExecStart={roost} run --config {config}", template)
    for name in secrets:
        line = f"LoadCredential={name}:{credentials / name}"
        text, found = re.subn(rf"(?m)^#LoadCredential={name}:.*$", line, text)
        if not found:
            text, found = re.subn(r"(?m)((?:^#?LoadCredential=.*\n)+)", rf"\g<1>{line}\n",
                                  text, count=1)
        if not found:
            text = text.replace("[Service]\n", f"[Service]\n{line}\n", 1)
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
    parser.add_argument("--credentials-dir", type=Path, metavar="PATH",
                        help="where the secrets go (default ~/.config/roost/credentials, "
                             "/etc/roost/credentials for root)")
    parser.add_argument("--state-dir", type=Path, metavar="PATH",
                        help="the state directory the pairing is written to (default: the "
                             "config's; /var/lib/roost for /etc/roost/roost.toml)")
    parser.add_argument("--pair-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="how long to wait for the owner to write to the bot, on a "
                             "platform that pairs them so (default 300; 0 skips pairing)")
    parser.add_argument("--no-service", action="store_true",
                        help="do not install the user unit; print the commands instead")
    for platform in installed().values():  # each platform's own flags, under its name
        group = parser.add_argument_group(platform.title)
        for flag in platform.init_flags:
            group.add_argument(flag.name, metavar=flag.metavar, default=flag.default,
                               type=Path if flag.path else str, help=flag.help)
