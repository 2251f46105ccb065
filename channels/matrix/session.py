"""The bot's login and what must outlive a restart: its device, its token, the sync position.

`<state_dir>/matrix/` holds nio's encryption store (`<user>_<device>.db`: the device's keys,
Olm and Megolm sessions, what devices it trusts) and roost's own `session.json`: the device id
and access token of the login (so a restart is the same device, with the same keys, and needs
no new login), and `next_batch`, the sync token after the last events roost has stored. Only
the sync loop advances it, and only once every event of that sync is in the durable intake, so
a crash between the two makes the next start fetch those events again, and the intake's dedupe
(by event id) drops what it already has.

`session.json` holds a secret (the access token): written with mode 0600 like nio's store.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nio import AsyncClient, LoginResponse, WhoamiError, WhoamiResponse  # type: ignore[import-untyped]

from channels.matrix.api import NETWORK_ERRORS
from channels.matrix.platform import log
from channels.matrix.settings import MatrixSettings
from daemon.core.errors import ChannelError, ConfigError
from daemon.store.files import atomic_write, dumps, read_json

FILE = "session.json"


@dataclass(frozen=True)
class Saved:
    user_id: str = ""
    device_id: str = ""
    access_token: str = ""
    next_batch: str = ""


class SessionFile:
    """`session.json`, read once at start, replaced atomically at each change."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / FILE
        self.saved = Saved()

    def load(self) -> Saved:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        doc: Any = read_json(self.path)
        if isinstance(doc, dict):
            self.saved = Saved(**{k: str(v) for k, v in doc.items()
                                  if k in Saved.__dataclass_fields__ and isinstance(v, str)})
        return self.saved

    def save(self, **changes: str) -> None:
        self.saved = replace(self.saved, **changes)
        atomic_write(self.path, dumps(self.saved.__dict__))
        os.chmod(self.path, 0o600)


async def sign_in(client: AsyncClient, settings: MatrixSettings, session: SessionFile) -> None:
    """Log the client in as the configured bot, on the same device as before when there was
    one; ConfigError when the homeserver refuses the credentials, ChannelError when it cannot
    be reached (systemd restarts roost to try again)."""
    saved = await asyncio.to_thread(session.load)
    if saved.user_id and saved.user_id != settings.user_id:
        saved = Saved(next_batch="")  # another bot's login: none of it applies
    device = settings.device_id or saved.device_id
    try:
        if settings.access_token:
            await _with_token(client, settings, settings.access_token, device)
        elif saved.access_token and (not settings.device_id
                                     or saved.device_id == settings.device_id) \
                and await _with_token(client, settings, saved.access_token, saved.device_id,
                                      refused_ok=True):
            pass
        elif settings.password:
            client.device_id = device  # empty: the homeserver makes a device, kept after
            answer = await client.login(settings.password, device_name=settings.device_name)
            if not isinstance(answer, LoginResponse):
                raise ConfigError("ROOST_MATRIX_PASSWORD",
                                  f"the homeserver refused the login of {settings.user_id}: "
                                  f"{answer.message}")
        else:
            raise ConfigError("matrix.enabled", "needs the bot's password or access token: set "
                              "ROOST_MATRIX_PASSWORD or ROOST_MATRIX_TOKEN")
    except NETWORK_ERRORS as exc:
        raise ChannelError(f"cannot reach the Matrix homeserver at {settings.homeserver}: "
                           f"{exc!r}") from exc
    await asyncio.to_thread(session.save, user_id=settings.user_id,
                            device_id=client.device_id, access_token=client.access_token,
                            next_batch=saved.next_batch)
    log.info("Matrix bot %s on device %s", client.user_id, client.device_id)


async def _with_token(client: AsyncClient, settings: MatrixSettings, token: str, device: str,
                      refused_ok: bool = False) -> bool:
    """Restore a login from a token (its device from the homeserver when not known); False
    when the homeserver no longer takes the token and `refused_ok` (a password login
    follows)."""
    client.access_token = token
    client.user_id = settings.user_id
    who = await client.whoami()
    if isinstance(who, WhoamiError) or not isinstance(who, WhoamiResponse):
        if refused_ok and settings.password:
            client.access_token = ""
            return False
        raise ConfigError("ROOST_MATRIX_TOKEN", f"the homeserver refused the access token: "
                          f"{getattr(who, 'message', who)}")
    if who.user_id != settings.user_id:
        raise ConfigError("matrix.user_id", f"the access token belongs to {who.user_id}, not "
                          f"{settings.user_id}")
    device = device or who.device_id or ""
    if not device:
        raise ConfigError("matrix.device_id", "the homeserver did not say which device the "
                          "access token belongs to: set matrix.device_id")
    client.restore_login(settings.user_id, device, token)
    return True
