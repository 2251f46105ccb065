"""Voice notes and audio files, heard before their turn.

The chat's worker hands the messages of a turn to `Hearing.hear` before the turn runs (never
the webhook's ack path, never the event loop: the length is read in a thread, the backend works
over HTTP or in its own thread). Each recording is measured (`audio.duration_of`), refused
above `voice.max_duration`, and transcribed while holding a model slot (`hold`, the model
client's `slot`: interactive chats first, a fold gives way, an automation waits), since the
backend shares the one GPU with Ollama.

A transcript becomes the message's text, "[voice note, 0:42] ...", after whatever the user
wrote with it, and the recording stays an attachment whose note tells the model it was
transcribed. The result is written back to the inbox item (`Store.inbox_update`) with
`meta["voice"]`, so a turn tried again after an outage or a restart neither transcribes nor
tells the user twice; the turn then stores text and meta with the message, where replays,
`memory_search` and `/transcript` find them. When transcription is off, fails or the recording
is too long, the model gets the reference note as before and the user one short line why.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from daemon.core.config import VoiceSettings
from daemon.core.errors import AttachmentError, VoiceError
from daemon.core.logs import voice_log as log
from daemon.core.messages import Inbound
from daemon.store import Store
from daemon.store.attachments import stored_path
from daemon.voice.audio import clock, duration_of
from daemon.voice.backends import Backend

AUDIO_KINDS = ("voice", "audio")
# Characters of a transcript kept: ten minutes of fast speech is about 12,000.
TRANSCRIPT_MAX = 20_000
_BEFORE_BACKEND = ("off", "unreadable", "too_long")
Notify = Callable[[str, str], Awaitable[None]]  # (chat_key, text)
Hold = Callable[[], AbstractAsyncContextManager[None]]
# The channel's "working" context for a chat (typing...), shown while a recording is heard.
Working = Callable[[str], AbstractAsyncContextManager[None]]
# (outcome, seconds the backend took or None): /metrics counts and times transcriptions.
Observe = Callable[[str, float | None], None]


def no_wait() -> AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()


def _nothing() -> AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class _Heard:
    text: str
    duration: float


class Hearing:
    """See the module docstring. `backend` None means transcription is off."""

    def __init__(self, settings: VoiceSettings, store: Store, backend: Backend | None, *,
                 hold: Hold = no_wait, observe: Observe | None = None,
                 clock_: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.store = store
        self.backend = backend
        self.hold = hold
        self.observe = observe
        self.clock = clock_
        self.attachments_dir = store.state_dir / "attachments"

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()

    async def hear(self, items: Sequence[Inbound], notify: Notify,
                   working: Working | None = None) -> list[Inbound]:
        """The items with their recordings transcribed (see the module docstring); `working`
        is entered once the transcription holds the model's slot, as a model call's is."""
        return [await self._item(item, notify, working) for item in items]

    async def _item(self, item: Inbound, notify: Notify, working: Working | None) -> Inbound:
        if "voice" in item.meta or not any(a.get("kind") in AUDIO_KINDS
                                           for a in item.attachments):
            return item  # nothing to hear, or heard before a restart or an outage
        lines: list[str] = []
        records: list[dict[str, Any]] = []
        attachments: list[Mapping[str, Any]] = []
        problems: list[str] = []
        for doc in item.attachments:
            if doc.get("kind") not in AUDIO_KINDS:
                attachments.append(doc)
                continue
            label = _label(doc)
            try:
                shown = working(item.chat_key) if working is not None else _nothing()
                heard = await self._hear_one(doc, label, shown)
            except VoiceError as exc:
                log.info("%s of %s not transcribed (%s)", label, item.chat_key, exc.reason)
                if exc.reason in _BEFORE_BACKEND:  # the backend's own are counted with its time
                    self._observed(exc.reason, None)
                problems.append(str(exc))
                records.append({"path": doc.get("path"), "status": exc.reason,
                                "why": str(exc)})
                attachments.append(doc)
                continue
            stamp = f"{label}, {clock(heard.duration)}"
            lines.append(f"[{stamp}] {heard.text or '(no speech heard)'}")
            records.append({"path": doc.get("path"), "status": "heard",
                            "duration": round(heard.duration, 2), "transcript": heard.text})
            attachments.append({**doc, "duration": round(heard.duration, 2), "note": (
                f"[the {label}'s recording: {doc.get('name', label)}, {clock(heard.duration)}, "
                f"stored at {doc.get('path')}; its transcript is the text above]")})
        text = "\n".join(part for part in (item.text, *lines) if part)
        meta = {**item.meta, "voice": records}
        heard_item = replace(item, text=text, attachments=tuple(attachments), meta=meta)
        await asyncio.to_thread(self.store.inbox_update, item.id, text=text,
                                attachments=[dict(a) for a in attachments], meta=meta)
        for problem in problems:
            await notify(item.chat_key, problem)
        return heard_item

    async def _hear_one(self, doc: Mapping[str, Any], label: str,
                        shown: AbstractAsyncContextManager[None]) -> _Heard:
        what = f"That {label}"
        if self.backend is None:
            raise VoiceError(f"I cannot listen to {label}s here: transcription is off (the "
                             "[voice] settings), so I only know you sent one. Please type it.",
                             "off")
        try:
            path = await asyncio.to_thread(stored_path, str(doc.get("path")),
                                           self.attachments_dir)
        except AttachmentError as exc:
            raise VoiceError(f"{what} is no longer stored here; please send it again.",
                             "unreadable") from exc
        duration = await asyncio.to_thread(duration_of, path, what)
        cap = self.settings.max_duration
        if duration > cap:
            raise VoiceError(f"{what} is {clock(duration)} long; I transcribe recordings of up "
                             f"to {clock(cap)}, so I only know you sent it. Please send a "
                             "shorter one, or type it.", "too_long")
        text = await self._transcribe(path, doc, label, shown)
        if len(text) > TRANSCRIPT_MAX:  # a server gone wrong: the message stays a message
            text = (f"{text[:TRANSCRIPT_MAX]}\n[the transcript is cut here: "
                    f"{len(text) - TRANSCRIPT_MAX:,} more characters]")
        return _Heard(text, duration)

    async def _transcribe(self, path: Path, doc: Mapping[str, Any], label: str,
                          shown: AbstractAsyncContextManager[None]) -> str:
        assert self.backend is not None
        async with self.hold(), shown:
            started = self.clock()
            try:
                text = await self.backend.transcribe(
                    path, name=str(doc.get("name") or path.name),
                    mime=str(doc.get("mime") or "application/octet-stream"))
            except VoiceError as exc:
                self._observed(exc.reason, self.clock() - started)
                raise VoiceError(f"I could not transcribe that {label}: {exc}. I only know "
                                 "you sent it; please type it, or send it again later.",
                                 exc.reason) from exc
        self._observed("heard", self.clock() - started)
        return text

    def _observed(self, outcome: str, seconds: float | None) -> None:
        if self.observe is not None:
            self.observe(outcome, seconds)


def _label(doc: Mapping[str, Any]) -> str:
    """How a recording is named: a voice note is what the platform says was recorded with its
    voice button (kind "voice"); any other sound is a file, an OGG one too."""
    return "voice note" if doc.get("kind") == "voice" else "audio file"


def last_transcript(store: Store, chat_key: str) -> str:
    """What `/transcript` answers: the chat's newest voice note or audio file as heard, or why
    it was not. Synchronous (reads the store)."""
    conversation = store.active_conversation(chat_key) or store.newest_conversation(chat_key)
    messages = store.messages(conversation.id) if conversation is not None else []
    for message in reversed(messages):
        records = message.meta.get("voice") if message.role == "user" else None
        if not records:
            continue
        record = records[-1]
        # Named as when it was heard: the recording's attachment is on the same message.
        label = next((_label(doc) for doc in message.attachments
                      if doc.get("path") == record.get("path")), "voice note")
        if record.get("status") == "heard":
            transcript = record.get("transcript") or "(no speech heard)"
            return f"Your last {label} ({clock(record.get('duration', 0))}), as I heard " \
                   f"it:\n{transcript}"
        return f"Your last {label} was not transcribed. {record.get('why', '')}".strip()
    return ("No voice note or audio file in this conversation yet: send one and I will "
            "transcribe it.")
