"""The WhatsApp Business Cloud API (Graph API) as roost uses it: plain aiohttp calls.

`POST /{version}/{phone_number_id}/messages` sends a text (or an uploaded audio file, after
`POST /{version}/{phone_number_id}/media`), or marks a received message read with the typing
indicator; `GET /{version}/{media_id}` gives a media file's short-lived URL, which is
downloaded with the same bearer token. Graph errors come back as
`{"error": {"message", "type", "code", "error_subcode", "error_data": {"details"}}}`; they are
raised as `GraphError` with the code, and `kind_of` says what roost does about each.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import aiohttp

from channels.whatsapp.platform import WhatsAppSettings
from daemon.core.bodies import MB, TooLarge, json_capped
from daemon.core.errors import ChannelError

# Error codes (developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes).
REENGAGEMENT = 131047  # more than 24 hours since the user last wrote: only templates allowed
PAIR_RATE_LIMIT = 131056  # too many messages to one user in a short time
THROUGHPUT_LIMIT = 130429  # the number's messages-per-second limit
RATE_LIMITS = frozenset({PAIR_RATE_LIMIT, THROUGHPUT_LIMIT, 4, 80007})
TOKEN_PROBLEMS = frozenset({190})  # expired or invalid token: fixable, so never give up
TEXT_LIMIT = 4096  # characters of a text message body
BUTTONS_BODY_LIMIT = 1024  # characters of an interactive message's body
TRACKING_LIMIT = 512  # characters of biz_opaque_callback_data
ANSWER_CAP = 4 * MB  # a Graph API answer (a message id, a template list): a few kilobytes


class Failure(enum.Enum):
    RETRY = "retry"  # rate limits, 5xx, network: the same call later succeeds
    REENGAGE = "reengage"  # the 24-hour window is closed: only the user can reopen it
    REFUSED = "refused"  # this message can never be sent as it is


class GraphError(ChannelError):
    """A Graph API call that failed; `code` is Meta's error code (0 when there was none)."""

    def __init__(self, status: int, code: int, title: str, *, maybe_sent: bool = False) -> None:
        self.status = status
        self.code = code
        self.title = title
        # The request left and its answer was lost (a dropped connection, a timeout): Meta may
        # have taken the message, so sending it again may show it twice.
        self.maybe_sent = maybe_sent
        super().__init__(f"HTTP {status}, code {code}: {title}")

    @property
    def kind(self) -> Failure:
        if self.code == REENGAGEMENT:
            return Failure.REENGAGE
        if self.status in (401, 429) or self.status >= 500 or self.code in RATE_LIMITS:
            return Failure.RETRY
        if self.code in TOKEN_PROBLEMS:  # a token can be fixed: wait for the owner to do it
            return Failure.RETRY
        return Failure.REFUSED  # any other 4xx, also one without Meta's error body


class GraphClient:
    """One aiohttp session for every Graph call; `start()` before use, `close()` after."""

    def __init__(self, settings: WhatsAppSettings, *, timeout: float = 30.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def base(self) -> str:
        return f"{self.settings.api_base}/{self.settings.api_version}"

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.settings.token}"}
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send_text(self, to: str, body: str, *, reply_to: str | None = None,
                        tracking: str | None = None) -> str:
        """Send a text message; returns the wamid Meta gave it. `tracking` comes back in the
        message's status webhooks (see `_tracked`)."""
        payload: dict[str, Any] = {"messaging_product": "whatsapp", "recipient_type": "individual",
                                   "to": to, "type": "text",
                                   "text": {"preview_url": False, "body": body}}
        if reply_to:
            payload["context"] = {"message_id": reply_to}
        _tracked(payload, tracking)
        answer = await self._call("POST", f"/{self.settings.phone_number_id}/messages", payload)
        messages = answer.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            return str(messages[0].get("id") or "")
        return ""

    async def upload_media(self, data: bytes, mime: str, name: str) -> str:
        """Upload a file for a later send (multipart: `file`, `type`, `messaging_product`);
        returns the media id Meta gave it."""
        form = aiohttp.FormData()
        form.add_field("messaging_product", "whatsapp")
        form.add_field("type", mime)
        form.add_field("file", data, filename=name, content_type=mime)
        answer = await self._call("POST", f"/{self.settings.phone_number_id}/media", None,
                                  form=form)
        media_id = answer.get("id")
        if not isinstance(media_id, str) or not media_id:
            raise GraphError(200, 0, "the upload answer has no id")
        return media_id

    async def send_audio(self, to: str, media_id: str, *, voice: bool,
                         reply_to: str | None = None, tracking: str | None = None) -> str:
        """Send an uploaded audio file, as a voice message with `voice`; returns the wamid."""
        audio: dict[str, Any] = {"id": media_id, **({"voice": True} if voice else {})}
        payload: dict[str, Any] = {"messaging_product": "whatsapp", "recipient_type": "individual",
                                   "to": to, "type": "audio", "audio": audio}
        if reply_to:
            payload["context"] = {"message_id": reply_to}
        _tracked(payload, tracking)
        answer = await self._call("POST", f"/{self.settings.phone_number_id}/messages", payload)
        messages = answer.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            return str(messages[0].get("id") or "")
        return ""

    async def send_buttons(self, to: str, body: str, buttons: Sequence[tuple[str, str]], *,
                           tracking: str | None = None) -> str:
        """Send an interactive reply-buttons message (up to three (id, title) buttons; Meta
        takes a body of 1,024 characters and titles of 20); returns the wamid."""
        payload: dict[str, Any] = {
            "messaging_product": "whatsapp", "recipient_type": "individual", "to": to,
            "type": "interactive", "interactive": {
                "type": "button", "body": {"text": body[:BUTTONS_BODY_LIMIT]},
                "action": {"buttons": [{"type": "reply", "reply": {"id": i, "title": t[:20]}}
                                       for i, t in buttons[:3]]}}}
        _tracked(payload, tracking)
        answer = await self._call("POST", f"/{self.settings.phone_number_id}/messages", payload)
        messages = answer.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            return str(messages[0].get("id") or "")
        return ""

    async def send_template(self, to: str, name: str, language: str,
                            parameter: str | None = None) -> str:
        """Send an approved template (the one kind of message Meta delivers outside the
        24-hour window); `parameter` fills its one body parameter. Returns the wamid."""
        template: dict[str, Any] = {"name": name, "language": {"code": language}}
        if parameter is not None:
            template["components"] = [{"type": "body", "parameters": [
                {"type": "text", "text": parameter}]}]
        payload = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to,
                   "type": "template", "template": template}
        answer = await self._call("POST", f"/{self.settings.phone_number_id}/messages", payload)
        messages = answer.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict):
            return str(messages[0].get("id") or "")
        return ""

    async def templates(self, waba_id: str, name: str) -> list[dict[str, Any]]:
        """`GET /{waba_id}/message_templates?name=`: the templates of that name, one per
        language, each with its `status` (APPROVED, PENDING, REJECTED...) and components."""
        answer = await self._call("GET", f"/{waba_id}/message_templates?name={name}", None)
        data = answer.get("data")
        return [t for t in data if isinstance(t, dict)] if isinstance(data, list) else []

    async def mark_read(self, message_id: str, *, typing: bool) -> None:
        """Blue ticks for the message (and those before it); with `typing`, the indicator that
        lasts until roost answers or 25 seconds pass."""
        payload: dict[str, Any] = {"messaging_product": "whatsapp", "status": "read",
                                   "message_id": message_id}
        if typing:
            payload["typing_indicator"] = {"type": "text"}
        await self._call("POST", f"/{self.settings.phone_number_id}/messages", payload)

    async def media_url(self, media_id: str) -> tuple[str, str | None, int | None]:
        """The download URL (valid for minutes), MIME type and size of an inbound media file."""
        answer = await self._call("GET", f"/{media_id}", None)
        url = answer.get("url")
        if not isinstance(url, str) or not url:
            raise GraphError(200, 0, "the media answer has no url")
        size = answer.get("file_size")
        return url, answer.get("mime_type"), int(size) if isinstance(size, int | str) else None

    async def download(self, url: str, limit: int) -> bytes:
        """The file behind a media URL (bearer token required), at most `limit` bytes."""
        session = self._require()
        # A large video takes longer than an API call: only a stalled read times out.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout,
                                        sock_read=self.timeout)
        try:
            async with session.get(url, timeout=timeout) as response:
                if response.status != 200:
                    raise GraphError(response.status, 0, "media download failed")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > limit:
                        raise GraphError(413, 0, f"the file is larger than {limit} bytes")
                    chunks.append(chunk)
                return b"".join(chunks)
        except aiohttp.ClientError as exc:  # refused, reset, cut off: worth a retry
            raise GraphError(503, 0, f"the download was cut off: {exc}") from exc
        except TimeoutError as exc:
            raise GraphError(504, 0, "the download stalled") from exc

    async def phone_number(self) -> dict[str, Any]:
        """`GET /{phone_number_id}`: proves the token is valid for this number (doctor)."""
        return await self._call("GET", f"/{self.settings.phone_number_id}", None)

    async def _call(self, method: str, path: str, payload: dict[str, Any] | None, *,
                    form: aiohttp.FormData | None = None) -> dict[str, Any]:
        session = self._require()
        try:
            async with session.request(method, self.base + path, json=payload,
                                       data=form) as response:
                try:
                    answer = await json_capped(response, ANSWER_CAP)
                except TooLarge as exc:
                    raise GraphError(response.status, 0, f"the Graph API sent {exc}") from exc
                except ValueError:
                    answer = None
                if response.status == 200 and isinstance(answer, dict):
                    return answer
                raise _error(response.status, answer)
        except aiohttp.ClientConnectorError as exc:  # refused: nothing left, worth a retry
            raise GraphError(503, 0, f"cannot reach the Graph API: {exc}") from exc
        except aiohttp.ClientError as exc:  # reset, cut off: worth a retry, maybe taken
            raise GraphError(503, 0, f"cannot reach the Graph API: {exc}",
                             maybe_sent=True) from exc
        except TimeoutError as exc:
            raise GraphError(504, 0, "the Graph API did not answer in time",
                             maybe_sent=True) from exc

    def _require(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("GraphClient.start() first")
        return self._session


def _tracked(payload: dict[str, Any], tracking: str | None) -> None:
    """`biz_opaque_callback_data`: Meta does nothing with it but hand it back in the sent,
    delivered and read statuses of the message (at most 512 characters). roost puts the
    outbox item and part in it, to recognise a send whose answer it never got."""
    if tracking:
        payload["biz_opaque_callback_data"] = tracking[:TRACKING_LIMIT]


def _error(status: int, answer: object) -> GraphError:
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return GraphError(status, 0, f"unexpected answer ({status})")
    code = error.get("code")
    data = error.get("error_data")
    details = data.get("details") if isinstance(data, dict) else None
    title = str(error.get("message") or error.get("title") or "")
    if details:
        title = f"{title} ({details})"
    return GraphError(status, code if isinstance(code, int) else 0, title)
