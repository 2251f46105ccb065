"""A spoken reply as a Telegram voice note: `sendVoice` with the OGG/Opus file uploaded
(multipart, as python-telegram-bot sends bytes), replying to the message it answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from telegram import Bot, ReplyParameters

from channels.telegram.parse import address_of
from daemon.core.messages import Outbound


async def send_voice(bot: Bot, outbound: Outbound) -> str:
    """Send the item's voice note; returns its message_id. Telegram errors propagate."""
    assert outbound.audio is not None  # synthesised by the delivery before it is sent
    chat_id, topic = address_of(outbound.chat_key)
    data = await asyncio.to_thread(Path(outbound.audio).read_bytes)
    # Quotes the voice note it answers; sent anyway when that was deleted meanwhile.
    reply = (ReplyParameters(int(outbound.reply_to), allow_sending_without_reply=True)
             if outbound.reply_to else None)
    message = await bot.send_voice(chat_id, data, filename="voice-note.ogg",
                                   duration=round(outbound.seconds) or None,
                                   message_thread_id=topic, reply_parameters=reply)
    return str(message.message_id)
