"""`roost doctor` on a Matrix setup, against the real Synapse: the homeserver, and the login
roost keeps (with the session key a person compares when verifying the bot); a wrong address
or a dead token is a FAIL line with its fix, and doctor never logs in (no stray device)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from daemon.cli.doctor import run_doctor
from daemon.core.config import Settings
from tests.channels.matrix.conftest import Bot, EchoEngine
from tests.conftest import SettingsFactory
from tests.synapse.server import Homeserver


def matrix_settings(make_settings: SettingsFactory, bot: Bot, **changes: Any) -> Settings:
    values = {"enabled": True, "homeserver": bot.synapse.url, "user_id": bot.user_id,
              "password": "correct horse battery staple", **changes}
    return make_settings(matrix=values, model={"host": "http://127.0.0.1:9"},
                         daemon={"state_dir": bot.state_dir})


async def matrix_lines(settings: Settings) -> dict[str, dict[str, Any]]:
    out = io.StringIO()
    await run_doctor(settings, as_json=True, out=out)
    checks = json.loads(out.getvalue())["checks"]
    return {c["name"]: c for c in checks if c["name"].startswith(("matrix", "channels"))}


def devices(synapse: Homeserver, token: str) -> set[str]:
    answer = synapse.request("GET", "/_matrix/client/v3/devices", token=token)
    return {d["device_id"] for d in answer["devices"]}


async def test_doctor_before_and_after_roost_signed_in(bot: Bot, make_settings: SettingsFactory,
                                                       synapse: Homeserver) -> None:
    settings = matrix_settings(make_settings, bot)
    lines = await matrix_lines(settings)
    assert lines["matrix homeserver"]["ok"] and synapse.url in lines["matrix homeserver"]["detail"]
    assert lines["matrix login"]["ok"] and "not signed in yet" in lines["matrix login"]["detail"]

    matrix, _ = await bot.start(EchoEngine)  # roost's login: a device, its keys published
    device = matrix.session.saved.device_id
    await bot.stop(matrix)
    token = matrix.session.saved.access_token
    before = devices(synapse, token)
    lines = await matrix_lines(settings)
    login = lines["matrix login"]
    assert login["ok"] and f"device {device}" in login["detail"]
    assert "session key" in login["detail"] and "not published" not in login["detail"]
    assert devices(synapse, token) == before  # doctor logged nothing in


async def test_a_wrong_address_and_a_dead_token_are_fail_lines(
        bot: Bot, make_settings: SettingsFactory, synapse: Homeserver, tmp_path: Path) -> None:
    nowhere = matrix_settings(make_settings, bot, homeserver="http://127.0.0.1:9")
    lines = await matrix_lines(nowhere)
    assert not lines["matrix homeserver"]["ok"]
    assert "matrix.homeserver" in lines["matrix homeserver"]["fix"]

    dead = matrix_settings(make_settings, bot, access_token="syt_not_a_token")
    lines = await matrix_lines(dead)
    assert lines["matrix homeserver"]["ok"] and not lines["matrix login"]["ok"]
    assert "ROOST_MATRIX_PASSWORD" in lines["matrix login"]["fix"]
