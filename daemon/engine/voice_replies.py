"""Voice replies: when roost speaks a reply, and the voice note that follows it.

`/voice on|off|auto` is a chat flag (`voice`, in the store's chats.json like /model), so it
outlives a restart; `auto` (no flag) speaks the replies to a voice note that was heard. The text
reply is stored, queued and sent as always: it is what is stored, searched and replayed. Just
before the chat's worker sends it the first time, `ready` queues the voice note as an outbox item
of its own (kind "voice", its id derived from the reply's, so it is queued at most once, its
text the spoken words), which the worker sends after the reply. Since it is on disk before the
reply leaves, a crash between the two still sends it, once. Its audio is synthesised when the
worker comes to it, holding the model's slot as a transcription does; a synthesis that fails
gets one short line, and the reply is delivered anyway.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Literal

from daemon.core.errors import VoiceError
from daemon.core.ids import inbound_id
from daemon.core.logs import voice_log as log
from daemon.core.messages import Outbound
from daemon.core.platforms import platform_of
from daemon.store import Store
from daemon.voice.speaking import Speaking
from daemon.voice.spoken import spoken_text

FLAG = "voice"
Mode = Literal["on", "off", "auto"]
MODES: tuple[Mode, ...] = ("on", "off", "auto")
CUT_LINE = "(The voice note reads the start; the rest is written above.)"
HOW_TO_TURN_ON = ("Speech is off on this roost: set a [speech] backend in the config "
                  "(\"espeak-ng\", or \"http\" with the url of a speech server) and restart.")


class VoiceReplies:
    """See the module docstring. `hold` is the model client's slot (chats first)."""

    def __init__(self, *, store: Store, speaking: Speaking | None,
                 hold: Callable[[], AbstractAsyncContextManager[None]],
                 clock: Callable[[], float], wake: Callable[[str], None],
                 max_seconds: float) -> None:
        """`wake` has the chat's worker look at its outbox again (an item queued here)."""
        self.store = store
        self.wake = wake
        self.speaking = speaking
        self.hold = hold
        self.clock = clock
        self.max_seconds = max_seconds

    async def mode_of(self, chat_key: str) -> Mode:
        flags = await asyncio.to_thread(self.store.chat_flags, chat_key)
        chosen = flags.get(FLAG)
        return chosen if chosen in ("on", "off") else "auto"

    async def command(self, chat_key: str, text: str) -> str:
        """`/voice` (says the mode) or `/voice on|off|auto`; the answer for the user."""
        words = text.split()
        wanted = words[1].lower() if len(words) > 1 else ""
        if not wanted:
            mode = await self.mode_of(chat_key)
            speech = "Speech is set up." if self.speaking is not None else HOW_TO_TURN_ON
            return f"Voice replies: {mode} ({_meaning(mode)}). {speech}"
        chosen = next((m for m in MODES if m == wanted), None)
        if chosen is None:
            return "Use /voice on, /voice off or /voice auto."
        if chosen == "on" and self.speaking is None:
            return HOW_TO_TURN_ON
        await asyncio.to_thread(self.store.set_chat_flag, chat_key, FLAG,
                                None if chosen == "auto" else chosen)
        return f"Voice replies: {chosen} ({_meaning(chosen)})."

    async def ready(self, outbound: Outbound) -> Outbound | None:
        """The item as it goes out: a reply to be spoken has its voice note queued (and says
        when the voice note is cut); a voice note gets its audio. None: nothing to send (the
        synthesis failed; the user is told in one line)."""
        if outbound.kind == "voice":
            return await self._synthesised(outbound)
        if outbound.kind != "reply" or not await self._speaks(outbound):
            return outbound
        spoken = spoken_text(outbound.text, max_seconds=self.max_seconds)
        if not spoken.text.strip():
            return outbound
        voice = dataclasses.replace(
            outbound, id=inbound_id(outbound.created, f"{outbound.id}:voice"), kind="voice",
            text=spoken.text, created=outbound.created + 0.001, parts_sent=0, pieces_sent=0,
            attempting=None, platform_ids=(), held=None, buttons=())
        await asyncio.to_thread(self._queue_once, voice)
        self.wake(outbound.chat_key)  # the pass sending the reply did not read it
        # For the user only: the stored message stays the model's words.
        return dataclasses.replace(outbound, text=f"{outbound.text}\n\n{CUT_LINE}") \
            if spoken.cut else outbound

    def _queue_once(self, voice: Outbound) -> None:
        queued = any(o["id"] == voice.id for o in self.store.outbox_pending(voice.chat_key))
        if not queued and not self.store.was_sent(voice.id):
            self.store.outbox_add(voice.to_doc())

    async def _speaks(self, outbound: Outbound) -> bool:
        if self.speaking is None or outbound.origin is not None \
                or "voice" not in getattr(platform_of(outbound.chat_key), "sends", ()):
            return False
        mode = await self.mode_of(outbound.chat_key)
        if mode != "auto":
            return mode == "on"
        return await asyncio.to_thread(self._answers_a_voice_note, outbound)

    def _answers_a_voice_note(self, outbound: Outbound) -> bool:
        """Whether a message this reply answers had a voice note that was heard."""
        if outbound.conversation_id is None or outbound.message_id is None:
            return False
        messages = self.store.messages(outbound.conversation_id)
        reply = next((m for m in reversed(messages) if m.id == outbound.message_id), None)
        answered = set(reply.meta.get("inbox_ids", ())) if reply is not None else set()
        return any(m.role == "user" and m.meta.get("inbox_id") in answered
                   and any(r.get("status") == "heard" for r in m.meta.get("voice") or ())
                   for m in messages)

    async def _synthesised(self, outbound: Outbound) -> Outbound | None:
        if outbound.audio is not None:  # synthesised before a failed send or a restart
            return outbound
        try:
            if self.speaking is None:
                raise VoiceError("speech is off on this roost", "off")
            async with self.hold():
                note = await self.speaking.speak(outbound.text)
        except VoiceError as exc:
            log.info("reply for %s not spoken (%s)", outbound.chat_key, exc.reason)
            await asyncio.to_thread(self._failed, outbound, str(exc))
            self.wake(outbound.chat_key)
            return None
        await asyncio.to_thread(self.store.outbox_update, outbound.id, audio=str(note.path),
                                seconds=note.seconds)
        return dataclasses.replace(outbound, audio=str(note.path), seconds=note.seconds)

    def _failed(self, outbound: Outbound, why: str) -> None:
        notice = Outbound(chat_key=outbound.chat_key, created=self.clock(), kind="notice",
                          text=f"I could not speak that reply ({why}); it is written above.")
        self.store.outbox_add(notice.to_doc())
        self.store.outbox_done(outbound.id)


def _meaning(mode: Mode) -> str:
    return {"on": "every reply also comes as a voice note",
            "off": "text only",
            "auto": "a voice note is answered with a voice note too"}[mode]
