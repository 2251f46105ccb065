"""A loopback fake of the WhatsApp Business Cloud API (Graph API), for roost's tests.

It follows Meta's documented wire format (Cloud API reference, Graph API v23.0):

* ``POST /{version}/{phone_number_id}/messages`` with a JSON body and
  ``Authorization: Bearer <token>``. A text send (``type: text``) answers
  ``{"messaging_product": "whatsapp", "contacts": [{"input", "wa_id"}], "messages": [{"id"}]}``;
  a read receipt (``status: read``, optionally ``typing_indicator: {"type": "text"}``) answers
  ``{"success": true}``. A body over 4096 characters is refused (code 100).
* ``POST /{version}/{phone_number_id}/media`` (multipart: ``file``, ``type``,
  ``messaging_product``) uploads a file for a later send and answers ``{"id": media_id}``; a file
  that is not what its ``type`` says (an OGG without Opus) is refused with 131053 (media upload
  error). An ``audio`` send (``{"id", "voice"?}``) must name an uploaded file.
* ``GET /{version}/{media_id}`` answers ``{"messaging_product", "url", "mime_type", "sha256",
  "file_size", "id"}``; the url is served by this fake and, like Meta's lookaside URLs, needs the
  same bearer token.
* ``GET /{version}/{phone_number_id}`` answers the number's ``display_phone_number`` and
  ``verified_name``.
* Errors are ``{"error": {"message", "type": "OAuthException", "code", "error_subcode",
  "error_data": {"messaging_product", "details"}, "fbtrace_id"}}`` with Meta's HTTP status: 401
  and code 190 for a bad token, 400 for 131047 (re-engagement) and other refusals, 429 for
  130429 and 131056, 5xx for Meta's own failures.

Every call is recorded; ``fail_next`` and ``drop_next`` script faults per kind of call
(``send``, ``read``, ``media``, ``download``). ``drop_next(..., done=True)`` copies a connection
Meta's edge drops after the message was taken: it reaches the user, the sender never hears of it.

With ``statuses_to(url, app_secret)``, each accepted send is followed, as Meta does, by signed
webhook calls to ``url`` with its ``sent`` and ``delivered`` statuses (``id``, ``status``,
``timestamp``, ``recipient_id`` and the ``biz_opaque_callback_data`` it was sent with, if any); a
call that fails (roost down, not 200) is tried again until it is taken, as Meta retries a
webhook, and with ``url`` None the statuses wait, as for a webhook that is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import re
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import BodyPartReader, web

from tests.fakes.flood import Flood

API_VERSION = "v23.0"
PHONE_NUMBER_ID = "277321005464405"
DISPLAY_NUMBER = "15550953877"
TEXT_LIMIT = 4096

# HTTP status Meta answers with for an error code.
_STATUS_OF = {131053: 400, 131047: 400, 131056: 429, 130429: 429, 190: 401, 131026: 400, 100: 400,
              131000: 500, 2: 503}
_TITLES = {
    131047: "Re-engagement message",
    131053: "Media upload error",
    131056: "(Business Account, Consumer Account) pair rate limit hit",
    130429: "Rate limit hit",
    131000: "Something went wrong",
    131026: "Message undeliverable",
    2: "Service temporarily unavailable",
    132000: "Number of parameters does not match the expected number of params",
    132001: "Template name does not exist in the translation",
}
WABA_ID = "104996122399160"


@dataclass(frozen=True)
class Template:
    """An approved (or not) message template as WhatsApp Manager keeps it."""

    name: str
    language: str = "en_US"
    status: str = "APPROVED"
    body: str = "Your report from roost is ready. Reply to see it."


@dataclass
class Call:
    method: str
    path: str
    kind: str  # send, template, read, upload, media, download, number, templates
    body: dict[str, Any]
    authorization: str
    accepted: bool = False  # Meta answered 200
    wamid: str | None = None  # the id Meta answered a send with
    time: float = field(default_factory=time.monotonic)  # when it arrived


@dataclass
class _Fault:
    code: int = 0  # 0: drop the connection
    status: int | None = None
    done: bool = False  # with code 0: a send is taken (it reaches the user), then the drop


@dataclass
class FakeGraph:
    token: str = "graph-test-token"
    host: str = "127.0.0.1"
    port: int = 0
    calls: list[Call] = field(default_factory=list)
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    templates: list[Template] = field(default_factory=list)
    number_flood: Flood | None = None  # the next phone number lookup: a server gone wrong
    _faults: dict[str, deque[_Fault]] = field(default_factory=lambda: defaultdict(deque))
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None
    _recorded: asyncio.Condition | None = None
    # Calls per second the fake answers, like the throughput Meta gives a number (80 messages
    # a second by default); None: as fast as asked (tests).
    rate: float | None = None
    _next_slot: float = 0.0
    # Statuses of accepted sends for roost's webhook (see `statuses_to`).
    _statuses_on: bool = False
    _status_url: str | None = None
    _app_secret: str = ""
    _statuses: deque[dict[str, Any]] = field(default_factory=deque)
    _status_ready: asyncio.Event | None = None
    _poster: asyncio.Task[None] | None = None
    statuses_posted: int = 0  # status webhook calls roost answered 200

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def sent(self) -> list[Call]:
        """Text sends Meta accepted, in order."""
        return [c for c in self.calls if c.kind == "send" and c.accepted]

    def texts(self, to: str | None = None) -> list[str]:
        """The text of each accepted message (an interactive one's body)."""
        return [c.body["interactive"]["body"]["text"] if c.body.get("type") == "interactive"
                else c.body["text"]["body"] for c in self.sent
                if c.body.get("type") != "audio" and (to is None or c.body["to"] == to)]

    def audio_sent(self, to: str | None = None) -> list[dict[str, Any]]:
        """The `audio` object of each accepted audio message ({"id", "voice"?})."""
        return [c.body["audio"] for c in self.sent
                if c.body.get("type") == "audio" and (to is None or c.body["to"] == to)]

    def templates_sent(self, to: str | None = None) -> list[dict[str, Any]]:
        """The `template` object of each accepted template message."""
        return [c.body["template"] for c in self.calls_of("template")
                if c.accepted and (to is None or c.body["to"] == to)]

    def buttons(self, to: str | None = None) -> list[list[dict[str, str]]]:
        """The reply buttons ({id, title}) of each accepted interactive message."""
        return [[b["reply"] for b in c.body["interactive"]["action"]["buttons"]]
                for c in self.sent if c.body.get("type") == "interactive"
                and (to is None or c.body["to"] == to)]

    def calls_of(self, kind: str) -> list[Call]:
        return [c for c in self.calls if c.kind == kind]

    def add_media(self, media_id: str, content: bytes, mime_type: str) -> None:
        self.media[media_id] = (content, mime_type)

    def fail_next(self, kind: str, code: int, *, times: int = 1,
                  status: int | None = None) -> None:
        """Answer the next `times` calls of `kind` with Meta's error `code`."""
        self._faults[kind].extend([_Fault(code, status)] * times)

    def drop_next(self, kind: str, times: int = 1, *, done: bool = False) -> None:
        """Close the connection of the next `times` calls of `kind` without an answer; with
        `done`, a send is taken first (the message reaches the user; roost never hears of it)."""
        self._faults[kind].extend([_Fault(done=done)] * times)

    def statuses_to(self, url: str | None, app_secret: str = "") -> None:
        """From now on, post the statuses of each accepted send to `url` (signed with
        `app_secret`); None keeps them until a url is given, as Meta keeps retrying a webhook
        that is down (here every 50 ms, there with growing pauses, for up to seven days)."""
        self._statuses_on = True
        self._status_url = url
        self._app_secret = app_secret or self._app_secret
        assert self._status_ready is not None
        self._status_ready.set()

    async def _post_statuses(self) -> None:
        assert self._status_ready is not None
        async with aiohttp.ClientSession() as http:
            while True:
                await self._status_ready.wait()
                self._status_ready.clear()
                while self._statuses and self._status_url:
                    body = webhook(statuses=(self._statuses[0],))
                    try:
                        async with http.post(self._status_url, data=body, headers={
                                "Content-Type": "application/json",
                                "X-Hub-Signature-256": sign(self._app_secret, body)}) as answer:
                            taken = answer.status == 200
                    except (aiohttp.ClientError, TimeoutError):
                        taken = False
                    if taken:
                        self._statuses.popleft()
                        self.statuses_posted += 1
                    else:  # down or refusing: again later, as Meta does
                        await asyncio.sleep(0.05)

    def _took(self, call: Call) -> str:
        """The send is accepted: its wamid, and (with `statuses_to`) its `sent` and
        `delivered` statuses (the phone got it), each one webhook call as Meta makes them."""
        call.accepted = True
        wamid = call.wamid = f"wamid.FAKE{next(self._ids):06d}"
        for state in ("sent", "delivered") if self._statuses_on else ():
            status: dict[str, Any] = {"id": wamid, "status": state, "timestamp": sent_now(),
                                      "recipient_id": str(call.body.get("to") or "")}
            if "biz_opaque_callback_data" in call.body:
                status["biz_opaque_callback_data"] = call.body["biz_opaque_callback_data"]
            self._statuses.append(status)
        if self._statuses_on:
            assert self._status_ready is not None
            self._status_ready.set()
        return wamid

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 5.0) -> list[Call]:  # noqa: ASYNC109
        assert self._recorded is not None
        async with asyncio.timeout(timeout), self._recorded:
            await self._recorded.wait_for(lambda: len(self.calls_of(kind)) >= count)
        return self.calls_of(kind)

    async def wait_sent(self, count: int, timeout: float = 5.0) -> list[Call]:  # noqa: ASYNC109
        assert self._recorded is not None
        async with asyncio.timeout(timeout), self._recorded:
            await self._recorded.wait_for(lambda: len(self.sent) >= count)
        return self.sent

    async def __aenter__(self) -> FakeGraph:
        self._recorded = asyncio.Condition()
        self._status_ready = asyncio.Event()
        self._poster = asyncio.create_task(self._post_statuses(), name="fake-graph-statuses")
        app = web.Application()
        app.router.add_post("/{version}/{number}/messages", self._messages)
        app.router.add_post("/{version}/{number}/media", self._upload)
        app.router.add_get("/download/{media_id}", self._download)
        app.router.add_get("/{version}/{object_id}", self._object)
        app.router.add_get("/{version}/{waba_id}/message_templates", self._templates)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.05)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._poster is not None:
            self._poster.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poster
        if self._runner is not None:
            await self._runner.cleanup()

    # -- HTTP ------------------------------------------------------------------------------

    async def _record(self, request: web.Request, kind: str, body: dict[str, Any]) -> Call:
        if self.rate:  # each call waits for its slot, as Meta spreads a number's traffic
            now = asyncio.get_running_loop().time()
            self._next_slot = max(self._next_slot, now) + 1 / self.rate
            await asyncio.sleep(self._next_slot - now - 1 / self.rate)
        call = Call(request.method, request.path, kind, body,
                    request.headers.get("Authorization", ""))
        self.calls.append(call)
        assert self._recorded is not None
        async with self._recorded:
            self._recorded.notify_all()
        return call

    def _fault(self, request: web.Request, kind: str,
               call: Call | None = None) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return error(190, "Invalid OAuth access token - Cannot parse access token")
        if faults := self._faults[kind]:
            fault = faults.popleft()
            if not fault.code:
                if fault.done and call is not None:
                    self._took(call)
                if request.transport is not None:
                    request.transport.close()
                return web.Response()  # never reaches the client
            return error(fault.code, _TITLES.get(fault.code, "Error"), fault.status)
        return None

    async def _messages(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            await self._record(request, "send", {})
            return error(100, "Invalid parameter")
        # A template is a kind of its own: the 24-hour rule that refuses sends never refuses it.
        kind = ("read" if body.get("status") == "read"
                else "template" if body.get("type") == "template" else "send")
        call = await self._record(request, kind, body)
        if request.match_info["number"] != PHONE_NUMBER_ID:
            return error(100, "Unsupported post request. Object with ID does not exist")
        if (fault := self._fault(request, kind, call)) is not None:
            return fault
        if body.get("messaging_product") != "whatsapp":
            return error(100, "The parameter messaging_product is required.")
        if kind == "read":
            if not str(body.get("message_id") or "").startswith("wamid."):
                return error(100, "Invalid parameter")
            return web.json_response({"success": True})
        if body.get("type") == "template":
            return self._template_send(call, body)
        if body.get("type") == "audio":
            return self._audio_send(call, body)
        text = (body.get("text") or {}).get("body") if body.get("type") == "text" else None
        if body.get("type") == "interactive":
            if problem := _interactive_problem(body.get("interactive")):
                return error(131009, f"Parameter value is not valid: {problem}", 400)
            text = body["interactive"]["body"]["text"]
        if not isinstance(text, str) or not text.strip() or not body.get("to"):
            return error(100, "Invalid parameter")
        if len(text) > TEXT_LIMIT:
            return error(100, "Param text['body'] must be at most 4096 characters long.")
        wamid = self._took(call)
        return web.json_response({"messaging_product": "whatsapp",
                                  "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                                  "messages": [{"id": wamid}]})

    async def _upload(self, request: web.Request) -> web.Response:
        """A media upload: the file is kept (under `media`, as an inbound file would be) and
        its id answered; the call records the form's fields, the file's name, type and size."""
        fields: dict[str, Any] = {}
        content = b""
        if request.content_type == "multipart/form-data":
            async for part in await request.multipart():
                if isinstance(part, BodyPartReader) and part.name == "file":
                    content = bytes(await part.read())
                    fields["filename"] = part.filename
                    fields["content_type"] = part.headers.get("Content-Type")
                elif isinstance(part, BodyPartReader) and part.name is not None:
                    fields[part.name] = await part.text()
        call = await self._record(request, "upload", fields | {"size": len(content)})
        if (fault := self._fault(request, "upload")) is not None:
            return fault
        if fields.get("messaging_product") != "whatsapp":
            return error(100, "The parameter messaging_product is required.")
        if not content or not fields.get("type"):
            return error(100, "The parameter file is required.")
        if str(fields["type"]).startswith("audio/ogg") and not content.startswith(b"OggS"):
            return error(131053, _TITLES[131053])
        media_id = f"{next(self._ids):016d}"
        self.media[media_id] = (content, str(fields["type"]))
        call.accepted = True
        return web.json_response({"id": media_id})

    def _audio_send(self, call: Call, body: dict[str, Any]) -> web.Response:
        audio = body.get("audio")
        if not isinstance(audio, dict) or audio.get("id") not in self.media or not body.get("to"):
            return error(131053, _TITLES[131053])
        wamid = self._took(call)
        return web.json_response({"messaging_product": "whatsapp",
                                  "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                                  "messages": [{"id": wamid}]})

    def _template_send(self, call: Call, body: dict[str, Any]) -> web.Response:
        """A template goes out whatever the 24-hour window, if it exists in that language, is
        approved, and gets as many body parameters as its text has placeholders."""
        template = body.get("template") or {}
        language = (template.get("language") or {}).get("code")
        found = next((t for t in self.templates if t.name == template.get("name")
                      and t.language == language and t.status == "APPROVED"), None)
        if found is None or not body.get("to"):
            return error(132001, _TITLES[132001], 404)
        given = sum(len(c.get("parameters") or []) for c in template.get("components") or []
                    if c.get("type") == "body")
        if given != len(re.findall(r"\{\{\d+\}\}", found.body)):
            return error(132000, _TITLES[132000], 400)
        wamid = self._took(call)
        return web.json_response({"messaging_product": "whatsapp",
                                  "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                                  "messages": [{"id": wamid, "message_status": "accepted"}]})

    async def _templates(self, request: web.Request) -> web.Response:
        await self._record(request, "templates", {})
        if (fault := self._fault(request, "templates")) is not None:
            return fault
        if request.match_info["waba_id"] != WABA_ID:
            return error(100, "Unsupported get request. Object with ID does not exist")
        name = request.query.get("name")
        return web.json_response({"data": [
            {"name": t.name, "language": t.language, "status": t.status, "category": "UTILITY",
             "id": hashlib.sha256(t.name.encode()).hexdigest()[:15],
             "components": [{"type": "BODY", "text": t.body}]}
            for t in self.templates if name is None or t.name == name]})

    async def _object(self, request: web.Request) -> web.Response:
        object_id = request.match_info["object_id"]
        kind = "number" if object_id == PHONE_NUMBER_ID else "media"
        await self._record(request, kind, {})
        if (fault := self._fault(request, kind)) is not None:
            return fault
        if kind == "number":
            if self.number_flood is not None and not self.number_flood.done:
                return await self.number_flood.send(request)
            return web.json_response({"display_phone_number": DISPLAY_NUMBER,
                                      "verified_name": "roost test", "id": PHONE_NUMBER_ID})
        if object_id not in self.media:
            return error(100, "Unsupported get request. Object with ID does not exist")
        content, mime = self.media[object_id]
        return web.json_response({
            "messaging_product": "whatsapp", "url": f"{self.url}/download/{object_id}",
            "mime_type": mime, "sha256": hashlib.sha256(content).hexdigest(),
            "file_size": len(content), "id": object_id})

    async def _download(self, request: web.Request) -> web.Response:
        await self._record(request, "download", {})
        if (fault := self._fault(request, "download")) is not None:
            return fault
        found = self.media.get(request.match_info["media_id"])
        if found is None:
            return web.Response(status=404)
        return web.Response(body=found[0], content_type=found[1])


def error(code: int, message: str, status: int | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "OAuthException", "code": code,
                      "error_data": {"messaging_product": "whatsapp", "details": message},
                      "fbtrace_id": "AbCdEfGh"}}
    return web.json_response(body, status=status or _STATUS_OF.get(code, 400))


def sign(app_secret: str, body: bytes) -> str:
    """The X-Hub-Signature-256 header Meta sends with `body`."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def webhook(*messages: dict[str, Any], statuses: tuple[dict[str, Any], ...] = (),
            name: str = "Test User") -> bytes:
    """A webhook body as Meta sends it (non-ASCII escaped, as Meta does)."""
    senders = {m["from"] for m in messages}
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": DISPLAY_NUMBER, "phone_number_id": PHONE_NUMBER_ID},
    }
    if messages:
        value["contacts"] = [{"profile": {"name": name}, "wa_id": s} for s in sorted(senders)]
        value["messages"] = list(messages)
    if statuses:
        value["statuses"] = list(statuses)
    body = {"object": "whatsapp_business_account",
            "entry": [{"id": "264937493375603", "changes": [{"value": value,
                                                               "field": "messages"}]}]}
    return json.dumps(body).encode()


def _interactive_problem(interactive: object) -> str:
    """What Meta refuses in a reply-buttons message (body up to 1,024 characters, one to
    three buttons with unique ids up to 256 characters and titles up to 20); "" when fine."""
    if not isinstance(interactive, dict) or interactive.get("type") != "button":
        return "interactive.type must be button"
    body = interactive.get("body")
    if not isinstance(body, dict) or not str(body.get("text") or "").strip():
        return "body.text is required"
    if len(body["text"]) > 1024:
        return "body.text is longer than 1024 characters"
    buttons = (interactive.get("action") or {}).get("buttons")
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= 3:
        return "action.buttons must hold 1 to 3 buttons"
    replies = [b.get("reply") if isinstance(b, dict) and b.get("type") == "reply" else None
               for b in buttons]
    if not all(isinstance(r, dict) for r in replies):
        return "each button must be of type reply"
    ids = [str(r["id"]) for r in replies]  # type: ignore[index]
    if len(set(ids)) != len(ids) or any(not i or len(i) > 256 for i in ids):
        return "button ids must be unique, 1-256 characters"
    if any(not str(r.get("title") or "") or len(str(r["title"])) > 20  # type: ignore[union-attr,index]
           for r in replies):
        return "button titles must be 1-20 characters"
    return ""


def button_reply(wamid: str, sender: str, button_id: str, title: str,
                 context: str = "") -> dict[str, Any]:
    """A tap on a reply button, as Meta sends it (type interactive, button_reply)."""
    message: dict[str, Any] = {"from": sender, "id": wamid, "timestamp": sent_now(),
                               "type": "interactive", "interactive": {
                                   "type": "button_reply",
                                   "button_reply": {"id": button_id, "title": title}}}
    if context:
        message["context"] = {"from": DISPLAY_NUMBER, "id": context}
    return message


def sent_now() -> str:
    """A message's `timestamp` as Meta gives it (seconds, a string), for a message sent now:
    roost drops one older than Meta's 7-day retry window."""
    return str(int(time.time()))


def text_message(wamid: str, sender: str, text: str, **fields: Any) -> dict[str, Any]:
    return {"from": sender, "id": wamid, "timestamp": sent_now(), "type": "text",
            "text": {"body": text}, **fields}
