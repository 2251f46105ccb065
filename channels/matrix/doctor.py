"""`roost doctor`'s checks of Matrix: the homeserver answers, and the bot's login is the one
roost will use (without logging in: a login from doctor would make the bot a new device)."""

from __future__ import annotations

import asyncio

import aiohttp

from channels.matrix.platform import MATRIX
from channels.matrix.session import SessionFile
from daemon.core.checks import Check, network_reason
from daemon.core.config import Settings
from daemon.core.redact import redact_url

TIMEOUT = aiohttp.ClientTimeout(total=10)


async def doctor_checks(settings: Settings) -> list[Check]:
    matrix = MATRIX.of(settings.platforms)
    base = matrix.homeserver.rstrip("/")
    shown = redact_url(base)
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        try:
            async with http.get(f"{base}/_matrix/client/versions") as answer:
                ok = answer.status == 200
                versions = (await answer.json(content_type=None)).get("versions", []) if ok \
                    else []
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return [Check("matrix homeserver", False, f"cannot reach {shown} "
                          f"({network_reason(exc)})", "check matrix.homeserver and the network")]
        if not ok:
            return [Check("matrix homeserver", False, f"{shown} answered {answer.status} for "
                          "/_matrix/client/versions: not a Matrix homeserver's client address",
                          "set matrix.homeserver to the client API's base URL")]
        spec = versions[-1] if versions else "?"
        checks = [Check("matrix homeserver", True, f"{shown} (spec {spec})")]
        saved = await asyncio.to_thread(SessionFile(settings.daemon.state_dir / "matrix").load)
        token = matrix.access_token or (saved.access_token if saved.user_id == matrix.user_id
                                        else "")
        if not token:
            checks.append(Check("matrix login", True, f"not signed in yet: `roost run` signs in "
                                f"as {matrix.user_id} with ROOST_MATRIX_PASSWORD and keeps the "
                                "device"))
            return checks
        async with http.get(f"{base}/_matrix/client/v3/account/whoami",
                            headers={"Authorization": f"Bearer {token}"}) as answer:
            body = await answer.json(content_type=None) if answer.status == 200 else {}
        if body.get("user_id") != matrix.user_id:
            checks.append(Check("matrix login", False, f"the homeserver refused the bot's token "
                                f"({answer.status})", "set ROOST_MATRIX_PASSWORD (roost signs in "
                                "again on the same device) or a fresh ROOST_MATRIX_TOKEN"))
            return checks
        device = body.get("device_id") or "?"
        key = await _device_key(http, base, token, matrix.user_id, device)
        checks.append(Check("matrix login", True, f"{matrix.user_id}, device {device}, session "
                            f"key {key}: compare it when you verify the bot's session"))
    return checks


async def _device_key(http: aiohttp.ClientSession, base: str, token: str, user_id: str,
                      device: str) -> str:
    """The device's ed25519 key as the homeserver publishes it (what a client shows as the
    session key), in groups of four; "not published yet" before roost first ran."""
    async with http.post(f"{base}/_matrix/client/v3/keys/query",
                         headers={"Authorization": f"Bearer {token}"},
                         json={"device_keys": {user_id: [device]}}) as answer:
        body = await answer.json(content_type=None) if answer.status == 200 else {}
    keys = (body.get("device_keys", {}).get(user_id, {}).get(device, {}).get("keys", {}))
    key = keys.get(f"ed25519:{device}") if isinstance(keys, dict) else None
    if not isinstance(key, str):
        return "not published yet (roost run publishes it)"
    return " ".join(key[i:i + 4] for i in range(0, len(key), 4))
