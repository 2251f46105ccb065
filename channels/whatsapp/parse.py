"""WhatsApp Cloud API webhooks -> what roost handles: the signature, the envelope, the messages.

Pure functions: no clock, store or network. The channel runs them in this order: `check_signature`
over the raw body bytes (Meta signs the bytes it sent; re-serialised JSON would not match, since
Meta escapes non-ASCII as \\uXXXX), `parse_webhook` for the envelope (one POST may carry several
entries, each several changes, each several messages and statuses), then `describe` to build what
the model reads of one message.

Meta adds fields over time; everything unknown is ignored rather than refused.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from daemon.core.approval import Choice, parse
from daemon.core.errors import ChannelError

SIGNATURE_HEADER = "X-Hub-Signature-256"
CHAT_PREFIX = "whatsapp:"
# Message types whose payload is a file roost fetches through the media endpoint.
MEDIA_TYPES = frozenset({"image", "audio", "video", "document", "sticker"})
QUOTE_CLIP = 200


class Signature(Enum):
    OK = "ok"
    MISSING = "missing"  # 401: the caller did not even try
    MISMATCH = "mismatch"  # 403: signed with another secret, or the body was changed


class NotAWebhook(ChannelError, ValueError):
    """A body that is valid JSON but not a WhatsApp Business Account webhook."""


@dataclass(frozen=True)
class WaMessage:
    """One message a user sent, with the envelope facts that go with it."""

    id: str  # the wamid: Meta's id, also the dedupe key (Meta retries for days)
    sender: str  # wa_id
    timestamp: int
    type: str
    body: Mapping[str, Any]  # the message object as Meta sent it
    profile_name: str | None = None
    business_number: str | None = None  # display_phone_number of the receiving number

    @property
    def chat_key(self) -> str:
        return chat_key(self.sender)


@dataclass(frozen=True)
class WaStatus:
    """What became of a message roost sent: sent, delivered, read or failed (with errors)."""

    id: str  # the wamid Meta gave roost's message
    status: str
    recipient: str
    timestamp: int
    errors: tuple[tuple[int, str], ...] = field(default=())
    tracking: str = ""  # the biz_opaque_callback_data roost sent the message with


@dataclass(frozen=True)
class Webhook:
    messages: tuple[WaMessage, ...]
    statuses: tuple[WaStatus, ...]


def chat_key(wa_id: str) -> str:
    return f"{CHAT_PREFIX}{wa_id}"


def wa_id_of(key: str) -> str:
    if not key.startswith(CHAT_PREFIX):
        raise ValueError(f"not a WhatsApp chat key: {key!r}")
    return key.removeprefix(CHAT_PREFIX)


def check_signature(app_secret: str, body: bytes, header: str | None) -> Signature:
    """`X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`, compared in constant
    time."""
    if not header:
        return Signature.MISSING
    expected = "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    given = header.strip().encode("ascii", "replace")
    return Signature.OK if hmac.compare_digest(given, expected.encode()) else Signature.MISMATCH


def parse_webhook(payload: object, phone_number_id: str | None = None) -> Webhook:
    """Every message and status in a webhook body, in the order Meta listed them; with
    `phone_number_id`, only those of that number (one Meta app may serve several)."""
    if not isinstance(payload, dict) or payload.get("object") != "whatsapp_business_account":
        raise NotAWebhook("not a whatsapp_business_account webhook")
    entries = payload.get("entry")
    if not isinstance(entries, list):
        raise NotAWebhook("entry is missing or not a list")
    messages: list[WaMessage] = []
    statuses: list[WaStatus] = []
    for entry in entries:
        for change in _dicts(entry.get("changes") if isinstance(entry, dict) else None):
            value = change.get("value")
            if change.get("field") != "messages" or not isinstance(value, dict):
                continue  # account updates, templates...: not roost's business
            metadata = value.get("metadata")
            number_id = metadata.get("phone_number_id") if isinstance(metadata, dict) else None
            if phone_number_id is not None and number_id != phone_number_id:
                continue  # another number of the same Meta app: not roost's to answer
            names = {c.get("wa_id"): c["profile"].get("name")
                     for c in _dicts(value.get("contacts")) if isinstance(c.get("profile"), dict)}
            number = (value.get("metadata") or {}).get("display_phone_number")
            for raw in _dicts(value.get("messages")):
                if message := _message(raw, names, number):
                    messages.append(message)
            for raw in _dicts(value.get("statuses")):
                if status := _status(raw):
                    statuses.append(status)
    return Webhook(tuple(messages), tuple(statuses))


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _message(raw: dict[str, Any], names: Mapping[Any, Any], number: object) -> WaMessage | None:
    wamid, sender, kind = raw.get("id"), raw.get("from"), raw.get("type")
    if not (isinstance(wamid, str) and wamid and isinstance(sender, str) and sender.isdigit()
            and isinstance(kind, str)):
        return None  # nothing to answer or to dedupe by
    name = names.get(sender)
    return WaMessage(id=wamid, sender=sender, timestamp=_int(raw.get("timestamp")), type=kind,
                     body=raw, profile_name=name if isinstance(name, str) else None,
                     business_number=number if isinstance(number, str) else None)


def _status(raw: dict[str, Any]) -> WaStatus | None:
    wamid, status = raw.get("id"), raw.get("status")
    if not (isinstance(wamid, str) and isinstance(status, str)):
        return None
    errors = tuple((_int(e.get("code")), str(e.get("title") or e.get("message") or ""))
                   for e in _dicts(raw.get("errors")))
    tracking = raw.get("biz_opaque_callback_data")
    return WaStatus(id=wamid, status=status, recipient=str(raw.get("recipient_id") or ""),
                    timestamp=_int(raw.get("timestamp")), errors=errors,
                    tracking=tracking if isinstance(tracking, str) else "")


def _int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


# ---- what the model reads ------------------------------------------------------------------


@dataclass(frozen=True)
class Described:
    """One message as roost handles it: the text for the model, the media to fetch, and
    whether it is a turn at all (a reaction is not)."""

    text: str
    media_id: str | None = None
    media_kind: str | None = None  # image, audio, video, document, sticker
    mime_type: str | None = None
    filename: str | None = None
    # An audio message's `voice`: recorded with WhatsApp's own voice button (True), or a file
    # (False); None where the payload does not say.
    voice: bool | None = None
    reaction: str | None = None  # the emoji, for a reaction (not a new turn)
    reacted_to: str | None = None  # the wamid reacted to
    unsupported: bool = False


def describe(message: WaMessage) -> Described:
    """Text, caption, location and contacts as words; media as a reference to fetch."""
    body = message.body
    context = _context_line(message)
    kind = message.type
    found = body.get(kind)
    inner: Mapping[str, Any] = found if isinstance(found, dict) else {}
    if kind == "text":
        return Described(_join(context, str(inner.get("body") or "")))
    if kind == "reaction":
        return Described("", reaction=str(inner.get("emoji") or ""),
                         reacted_to=str(inner.get("message_id") or "") or None)
    if kind in MEDIA_TYPES and isinstance(inner.get("id"), str):
        caption = str(inner.get("caption") or "")
        return Described(_join(context, caption), media_id=inner["id"], media_kind=kind,
                         mime_type=str(inner.get("mime_type") or "") or None,
                         filename=str(inner.get("filename") or "") or None,
                         voice=inner["voice"] if isinstance(inner.get("voice"), bool) else None)
    if kind == "location":
        place = ", ".join(str(inner[k]) for k in ("name", "address") if inner.get(k))
        where = f"{inner.get('latitude')}, {inner.get('longitude')}"
        return Described(_join(context, f"[Location: {place + ' at ' if place else ''}{where}]"))
    if kind == "contacts":
        return Described(_join(context, _contacts_note(_dicts(body.get("contacts")))))
    if kind in ("button", "interactive"):
        # These always answer one of roost's messages, so the context line is there even when
        # the reply itself carries nothing: never hand the model that alone as a user turn.
        said = _choice(kind, inner)
        return Described(_join(context, said)) if said else Described("", unsupported=True)
    return Described("", unsupported=True)


def _choice(kind: str, inner: Mapping[str, Any]) -> str:
    """What a button press, list choice or flow reply said: its title, else its id (the model
    sent the message that offered it, so the id means something to it); "" when empty."""
    def text(value: object) -> str:
        return " ".join(str(value or "").split())

    if kind == "button":  # a template's quick-reply button
        said = text(inner.get("text")) or text(inner.get("payload"))
        return f'[Pressed the button "{said}"]' if said else ""
    button, row, flow = (inner.get(k) for k in ("button_reply", "list_reply", "nfm_reply"))
    if isinstance(button, dict) and (said := text(button.get("title")) or text(button.get("id"))):
        return f'[Pressed the button "{said}"]'
    if isinstance(row, dict) and (said := text(row.get("title")) or text(row.get("id"))):
        detail = text(row.get("description"))
        return f'[Chose "{said}"{f" ({detail})" if detail else ""} from the list]'
    if isinstance(flow, dict):
        said = text(flow.get("body")) or text(flow.get("response_json"))
        return f"[Filled in a form: {said}]" if said else ""
    return ""


def _context_line(message: WaMessage) -> str:
    """A reply (`context.id`): the model learns that it answers something, and whose."""
    context = message.body.get("context")
    if not isinstance(context, dict):
        return ""
    if context.get("forwarded") or context.get("frequently_forwarded"):
        return "[Forwarded message]"
    if not context.get("id"):
        return ""
    ours = message.business_number and context.get("from") == message.business_number
    return "[Replying to your earlier message]" if ours else "[Replying to an earlier message]"


def _contacts_note(contacts: Sequence[Mapping[str, Any]]) -> str:
    people = []
    for contact in contacts:
        name = (contact.get("name") or {}).get("formatted_name") or "someone"
        phones = [str(p.get("phone")) for p in _dicts(contact.get("phones")) if p.get("phone")]
        people.append(f"{name} ({', '.join(phones)})" if phones else str(name))
    return f"[Shared contact: {'; '.join(people) or 'empty'}]"


def _join(context: str, text: str) -> str:
    return "\n".join(part for part in (context, text.strip()) if part)


def approval_reply(body: Mapping[str, Any]) -> tuple[str, Choice] | None:
    """(approval id, choice) when the message is a tap on one of roost's approval buttons
    (an interactive button_reply whose id roost chose); None for anything else."""
    interactive = body.get("interactive") if body.get("type") == "interactive" else None
    reply = interactive.get("button_reply") if isinstance(interactive, dict) else None
    button_id = reply.get("id") if isinstance(reply, dict) else None
    return parse(button_id) if isinstance(button_id, str) else None
