"""What every channel shares: the Inbound and Outbound records and the Channel protocol.

A channel only translates: a platform payload becomes an `Inbound`, an `Outbound` becomes
platform calls. Deciding whether to handle a message, and handling it, happen in `daemon/`.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from daemon.core.approval import Button
from daemon.core.ids import new_id

OutboundKind = Literal["reply", "notice", "voice"]


@dataclass(frozen=True)
class Inbound:
    """One message from a user, as persisted in the inbox before the platform gets its 200."""

    chat_key: str
    text: str
    received: float
    id: str = ""
    platform_id: str | None = None
    sender: str | None = None
    attachments: tuple[Mapping[str, Any], ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", new_id(self.received))

    @property
    def command(self) -> str | None:
        """`new` for `/new` (also `/new@botname`), None when the text is not a command."""
        if not self.text.startswith("/"):
            return None
        word = self.text[1:].split(maxsplit=1)[0] if len(self.text) > 1 else ""
        return word.split("@", 1)[0].lower() or None

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["attachments"] = [dict(a) for a in self.attachments]
        doc["meta"] = dict(self.meta)
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Inbound:
        return cls(
            chat_key=doc["chat_key"],
            text=doc["text"],
            received=doc["received"],
            id=doc["id"],
            platform_id=doc.get("platform_id"),
            sender=doc.get("sender"),
            attachments=tuple(doc.get("attachments", ())),
            meta=doc.get("meta", {}),
        )


# A chat flag the WhatsApp channel keeps of the templates it sent to reopen the 24-hour window
# ({"last": when, "count": how many, "refused": when Meta last refused one}); /status shows it.
TEMPLATE_FLAG = "whatsapp_template"


@dataclass(frozen=True)
class Outbound:
    """One reply or notice for a chat, persisted in the outbox before it is sent."""

    chat_key: str
    text: str
    created: float
    kind: OutboundKind = "reply"
    id: str = ""
    conversation_id: str | None = None
    message_id: str | None = None
    reply_to: str | None = None  # the platform's id of the message this answers
    parts_sent: int = 0  # delivery progress: a restart resumes after the last part sent
    held: str | None = None  # why it waits for the user to write again (WhatsApp's 24 hours)
    # The platform's ids of the messages sent so far (Telegram message_ids, WhatsApp wamids),
    # recorded by the channel with `parts_sent`.
    platform_ids: tuple[str, ...] = ()
    # Pieces of part `parts_sent` delivered when Telegram refused that part whole and it goes
    # in smaller pieces, each recorded as it goes (see channels.progress).
    pieces_sent: int = 0
    # The part whose send started and whose record is not on disk yet: left by a crash, it
    # may have reached the chat already (delivery is at least once; see channels.progress).
    attempting: int | None = None
    origin: str | None = None  # what queued it, when someone asks after it (an automation run)
    # Answers offered under the message (an approval question); a channel that cannot show
    # buttons lists them (channels.console).
    buttons: tuple[Button, ...] = ()
    # A "voice" item (a reply spoken, its text the words): the OGG/Opus file once synthesised
    # and its length in seconds (daemon.engine.voice_replies).
    audio: str | None = None
    seconds: float = 0.0
    # The same person's other chats, in order, for what this chat cannot take now (WhatsApp's
    # 24 hours): an automation's report to `person:NAME` (daemon.engine.delivery).
    fallbacks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", new_id(self.created))

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> Outbound:
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc}
        known["platform_ids"] = tuple(known.get("platform_ids", ()))  # a list in JSON
        known["fallbacks"] = tuple(known.get("fallbacks", ()))
        known["buttons"] = tuple(Button(**b) for b in known.get("buttons", ()))
        return cls(**known)


class ReplySink(Protocol):
    """One turn's reply as the model writes it, shown by the channel while the turn runs (a
    Telegram draft, the terminal). What it shows is a preview: the reply itself still goes out
    through the outbox once the turn has saved it."""

    def write(self, delta: str) -> None:
        """The next piece of the reply's text."""
        ...

    def status(self, line: str) -> None:
        """What the model does instead of writing ("thinking...", "searching your
        conversations..."), shown until more text comes."""
        ...


class _Unseen:
    """The sink of a chat whose channel shows nothing while the reply is written."""

    def write(self, delta: str) -> None:
        pass

    def status(self, line: str) -> None:
        pass


UNSEEN: ReplySink = _Unseen()


class Channel(Protocol):
    """A messaging platform as the engine sees it."""

    name: str

    async def send(self, outbound: Outbound) -> None:
        """Deliver one outbox item; raise `DeliveryError` when it cannot be delivered
        (with `permanent=True` when retrying cannot help, e.g. the user blocked the bot).
        A platform channel records its progress on the item as it goes (`parts_sent`, and
        `platform_ids`: the platform's ids of what it sent)."""
        ...

    def streaming(self, chat_key: str) -> AbstractAsyncContextManager[ReplySink]:
        """Held for a whole turn of the chat: the sink shows the reply as it is written
        (channels that cannot show it ignore what they are given). Leaving it must stop
        whatever it started, before the turn's reply is sent."""
        ...

    def working(self, chat_key: str) -> AbstractAsyncContextManager[None]:
        """Held while a turn for the chat runs: a channel may show "typing…" meanwhile.
        Leaving it (turn done, failed or cancelled) must stop whatever it started."""
        ...
