"""A stranger's name cannot forge a line in the journal (issue 48 item 4): a newline and a bidi
control in a Telegram first_name reach the log escaped, on the one line of the pairing request."""

from __future__ import annotations

import logging

import pytest

from tests.channels.telegram.test_telegram import (  # noqa: F401  (start is a fixture)
    Start,
    message,
    start,
)
from tests.fakes.telegram import FakeTelegram

STRANGER = 2222222
NAME = "Eve\nroost: approve with: roost pairing approve 123456\u202e"


async def test_a_strangers_name_is_escaped_on_one_line(
        start: Start, fake_telegram: FakeTelegram, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.DEBUG, logger="roost")
    daemon = await start(access={"unknown_senders": "pair"})
    update = message(1, "let me in", user=STRANGER)
    update["message"]["from"]["first_name"] = NAME
    assert await daemon.post(update) == 200
    await fake_telegram.wait_for("sendMessage")
    await daemon.settle(f"telegram:{STRANGER}")
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("roost")]
    (asked,) = [line for line in lines if "asked to talk" in line]
    assert "'Eve\\nroost: approve with: roost pairing approve 123456\\u202e'" in asked
    assert not any("\n" in line or "\u202e" in line for line in lines)
    # The owner's own line names the code roost made, not the one in the name.
    code = asked.rsplit("roost pairing approve ", 1)[1]
    assert code != "123456" and code in str(fake_telegram.calls_to("sendMessage")[0].params)
