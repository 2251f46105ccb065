"""A spoken reply as a WhatsApp voice message: the OGG/Opus file uploaded to Meta, then sent as
`audio` with `voice: true`, replying to the message it answers. WhatsApp shows a voice message's
play icon only for a file of 512 KB or less (a download arrow above that), so a larger file goes
as plain audio (without `voice`), which plays from the chat all the same."""

from __future__ import annotations

import asyncio
from pathlib import Path

from channels.whatsapp.api import GraphClient
from daemon.core.messages import Outbound

VOICE_ICON_LIMIT = 512 * 1024  # bytes


async def send_voice(client: GraphClient, to: str, outbound: Outbound,
                     tracking: str | None = None) -> str:
    """Upload and send the item's voice note; returns the wamid. GraphErrors propagate."""
    assert outbound.audio is not None  # synthesised by the delivery before it is sent
    data = await asyncio.to_thread(Path(outbound.audio).read_bytes)
    media_id = await client.upload_media(data, "audio/ogg", "voice-note.ogg")
    return await client.send_audio(to, media_id, voice=len(data) <= VOICE_ICON_LIMIT,
                                   reply_to=outbound.reply_to, tracking=tracking)
