"""A loopback fake of the Telegram Bot API, for roost's tests.

It speaks what python-telegram-bot sends, so a real ``Bot(token, base_url=fake.api_base,
base_file_url=fake.file_base)`` or an ``Application`` built with ``.base_url``/``.base_file_url``
works against it unchanged. A call is ``POST <api_base><token>/<method>``, form-encoded, or
``multipart/form-data`` when it uploads a file (a part named after its parameter). PTB sends
``str`` values as they are and JSON-encodes the rest (ints, bools, ``reply_markup``), so the form
does not say which is which: the fake JSON-decodes every value but the free text in
``_TEXT_PARAMS``. Answers are ``{"ok": true, "result": ...}`` or ``{"ok": false, "error_code",
"description"}`` (plus ``parameters.retry_after`` for a 429); a file is ``GET
<file_base><token>/<file_path>``.

Order inside a call: record it, 401 for a wrong token, the next scripted fault of the method
(``fail_next``/``drop_next``), 404 for an unknown method, then the answer. Method names are
case-insensitive, as on Telegram. With ``parse_mode="HTML"`` a text is checked as Telegram's
parser (tdlib) does: its tags only, balanced, in its wording with UTF-8 byte offsets. Lengths
count the parsed text in code points (4096 for a message, 1024 for a caption); before any
parsing, a ``text`` over 32,768 bytes as sent is refused (the Bot API server's own cap on the
raw parameter, which a link-heavy HTML text reaches under 4096 visible characters).

A bot cannot write first: Telegram answers 403 "Forbidden: bot can't initiate conversation with
a user" for a private chat whose user never started the bot, and 403 "Forbidden: bot was blocked
by the user" after a block (python-telegram-bot raises ``telegram.error.Forbidden`` for both).
The fake knows who started it from ``started`` (given at construction or by ``start_chat``, for a
test that posts updates to roost's webhook itself) and from the sender of every update it
queues; ``block`` and ``unblock`` stand for the user's buttons. Groups are always open.

``sendMessageDraft`` (Bot API 9.5: every bot may stream a draft, an ephemeral preview of a
message being written) is answered for private chats only, topics included: in a group Telegram
answers 400 ``TEXTDRAFT_PEER_INVALID`` (the wording bots meet in the wild); a ``draft_id`` of 0
(or none) and a text over 4,096 characters (after parsing, as for a message) are 400s too. An
empty text is allowed (the client shows "Thinking..."). Each draft taken is kept in ``drafts``
(the chat's current draft text per ``draft_id``); a draft is never a message.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import re
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import BodyPartReader, web

from tests.fakes.flood import Flood

METHODS = (  # the Bot API methods the fake answers
    "getMe setWebhook deleteWebhook getWebhookInfo getUpdates sendMessage editMessageText"
    " deleteMessage sendChatAction sendPhoto sendDocument getFile setMyCommands"
    " answerCallbackQuery editMessageReplyMarkup sendMessageDraft sendVoice"
).split()
MESSAGE_LIMIT = 4096
RAW_TEXT_LIMIT = 32768  # bytes of `text` as sent, checked before parse_mode is applied
CAPTION_LIMIT = 1024

# Free-text parameters: never JSON-decoded, even when they look like a number.
_TEXT_PARAMS = frozenset(
    "text caption parse_mode secret_token url ip_address action file_id language_code"
    " inline_message_id business_connection_id message_effect_id photo document description"
    " voice".split()
)
# Without allowed_updates (or with an empty list) Telegram delivers all update kinds but these.
_OPT_IN_UPDATES = frozenset({"chat_member", "message_reaction", "message_reaction_count"})
_HTML_TAGS = frozenset(  # Telegram's HTML style; everything else is "Unsupported start tag"
    "a b strong i em u ins s strike del span tg-spoiler tg-emoji tg-time code pre"
    " blockquote".split()
)
_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
_ENTITY = re.compile(r"&(#[0-9]+|#x[0-9a-fA-F]+|[a-zA-Z]+);")
_TAG = re.compile(r"<(/?)([^\s>]*)((?:[^>\"']|\"[^\"]*\"|'[^']*')*)>")
_SPOILER_CLASS = re.compile(r"class\s*=\s*[\"']?tg-spoiler\b")
_COMMAND = re.compile(r"[a-z0-9_]{1,32}")
_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")


@dataclass(frozen=True)
class Call:
    """One API call as the fake received it; ``time`` is ``time.monotonic()``."""

    method: str
    params: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    time: float = 0.0


@dataclass(frozen=True)
class _Fault:
    status: int = 0  # 0: drop the connection instead of answering
    description: str = ""
    retry_after: int | None = None
    done: bool = False  # with status 0: the call does its work, then the connection drops


@dataclass(frozen=True)
class _File:
    file_id: str
    content: bytes
    file_path: str

    def info(self) -> dict[str, Any]:
        unique = hashlib.sha1(self.file_id.encode()).hexdigest()[:16]
        return {"file_id": self.file_id, "file_unique_id": unique, "file_size": len(self.content)}


class ApiError(Exception):
    """An error answer (status and Telegram's description), raised inside a method."""

    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description


def _bad(description: str) -> ApiError:
    return ApiError(400, f"Bad Request: {description}")


class FakeTelegram:
    """The Bot API on 127.0.0.1: records every call, answers like Telegram, scripts faults."""

    def __init__(
        self, token: str = "123456:TEST-TOKEN", bot_username: str = "roost_test_bot",
        started: Iterable[int] = (),
    ) -> None:
        self.token = token
        self.bot_username = bot_username
        self.started: set[int] = set(started)  # users who started the bot (private chats open)
        self.blocked: set[int] = set()  # users who blocked it
        self.host = "127.0.0.1"
        self.port = 0
        self.long_poll_cap = 1.0  # getUpdates waits at most this long, whatever its timeout
        self.latency = 0.0  # seconds each call takes to be answered, as over the internet
        self.calls: list[Call] = []
        self.sent_messages: list[dict[str, Any]] = []
        self.drafts: list[dict[str, Any]] = []  # the drafts taken: chat_id, draft_id, text, ...
        self.webhook: dict[str, Any] | None = None
        # The last failed delivery to the webhook, as getWebhookInfo reports it (None: none).
        self.webhook_error: str | None = None
        self.commands: list[dict[str, Any]] = []
        self.files: dict[str, _File] = {}
        self.downloads: list[str] = []  # the file paths downloaded, in order
        self.download_flood: Flood | None = None  # the next download: a server gone wrong
        self.messages: dict[tuple[int, int], dict[str, Any]] = {}  # (chat id, message id)
        # Callback queries made by tap(), by id: None until answerCallbackQuery answers one.
        self.callback_answers: dict[str, dict[str, Any] | None] = {}
        self._updates: list[dict[str, Any]] = []  # not yet confirmed by an offset
        self._next_update_id = 1
        self._allowed_updates: frozenset[str] = frozenset()
        self._update_queued = asyncio.Event()
        self._last_message_id: defaultdict[int, int] = defaultdict(int)
        self._faults: defaultdict[str, deque[_Fault]] = defaultdict(deque)
        self._call_recorded = asyncio.Condition()
        # Methods whose calls wait for release(), with how many are still answered first.
        self._held: dict[str, int] = {}
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        # Each method is answered by the handler named after it: getMe -> self._get_me.
        self._methods: dict[str, Callable[[Call], Awaitable[Any]]] = {
            name.lower(): getattr(self, "_" + re.sub("([A-Z])", r"_\1", name).lower())
            for name in METHODS
        }

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        return f"{self.url}/bot"

    @property
    def file_base(self) -> str:
        return f"{self.url}/file/bot"

    async def start(self) -> None:
        """Listen; with port 0 the first start picks a free port that later starts reuse."""
        app = web.Application(client_max_size=50 * 1024 * 1024)  # Telegram's upload limit
        app.router.add_post("/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        # Any other path (e.g. a base URL with a slash too many) gets Telegram's JSON 404.
        app.router.add_route("*", "/{path:.*}", self._not_found)
        # handler_cancellation: a client that gives up ends its long poll at once.
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=0.05, access_log=None
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]

    async def stop(self) -> None:
        """Close the listener and every connection (long polls are cut off)."""
        self.release()  # a held call would keep its handler, and so this, waiting
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> FakeTelegram:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- scripting and inspection ----------------------------------------------------------

    def calls_to(self, method: str) -> list[Call]:
        """The calls of one method (case-insensitive), in order of arrival."""
        return [c for c in self.calls if c.method.lower() == method.lower()]

    def fail_next(
        self,
        method: str,
        *,
        status: int,
        description: str,
        retry_after: int | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` calls of method with this error (they are still recorded)."""
        self._faults[method.lower()].extend([_Fault(status, description, retry_after)] * times)

    def drop_next(self, method: str, times: int = 1, *, done: bool = False) -> None:
        """Close the connection of the next `times` calls of method without an answer; with
        `done`, after the call did its work (a message sent that the client never hears of)."""
        self._faults[method.lower()].extend([_Fault(done=done)] * times)

    def hold(self, method: str, *, after: int = 0) -> None:
        """Record calls of method but answer none until `release()`, once `after` more have
        been answered: a stalled network, where the client cannot know whether the call did
        its work (it does, once released)."""
        self._held[method.lower()] = after
        self._released.clear()

    def release(self) -> None:
        """Answer the held calls, and the later ones at once."""
        self._held.clear()
        self._released.set()

    def queue_update(self, update: dict[str, Any]) -> None:
        """Queue an update for getUpdates; one without update_id gets the next one.

        Like Telegram, an update of a kind the last ``allowed_updates`` (of getUpdates or
        setWebhook) excludes is never created. Telegram has sent ``is_bot`` on every user since
        Bot API 3.0 and PTB 22 cannot parse a user without it; the fixtures in tests/fixtures
        predate it, so a missing one is filled in (false).
        """
        if not self._allowed(update):
            return
        update = copy.deepcopy(update)
        for content in update.values():  # the message, edited_message, callback_query...
            if isinstance(content, dict) and isinstance(content.get("from"), dict):
                content["from"].setdefault("is_bot", False)
                if type(content["from"].get("id")) is int:  # who writes to a bot started it
                    self.started.add(content["from"]["id"])
        update.setdefault("update_id", self._next_update_id)
        self._next_update_id = max(self._next_update_id, update["update_id"] + 1)
        self._updates.append(update)
        self._update_queued.set()

    def tap(self, user_id: int, chat_id: int, message_id: int, data: str) -> str:
        """A user taps an inline keyboard button of the bot's message: queues the
        callback_query update Telegram sends (the whole message with its keyboard, the
        button's callback_data); returns the query's id."""
        query_id = f"{len(self.callback_answers) + 1}{user_id}"
        self.callback_answers[query_id] = None
        self.queue_update({"callback_query": {
            "id": query_id, "from": {"id": user_id, "is_bot": False, "first_name": "Tapper"},
            "message": copy.deepcopy(self.messages[chat_id, message_id]),
            "chat_instance": f"-{abs(chat_id)}77", "data": data}})
        return query_id

    def add_file(self, file_id: str, content: bytes, file_path: str | None = None) -> None:
        """Make a file known to getFile and downloadable at its file_path."""
        self.files[file_id] = _File(file_id, content, file_path or f"documents/{file_id}")

    def start_chat(self, *user_ids: int) -> None:
        """These users started the bot (pressed Start, or wrote to it): it may write to them."""
        self.started.update(user_ids)

    def block(self, user_id: int) -> None:
        """The user blocked the bot: every send to them is refused until `unblock`."""
        self.blocked.add(user_id)

    def unblock(self, user_id: int) -> None:
        self.blocked.discard(user_id)

    # The contract names a timeout parameter: a test that waits should fail fast by default.
    async def wait_for(
        self,
        method: str,
        count: int = 1,
        timeout: float = 5.0,  # noqa: ASYNC109
    ) -> list[Call]:
        """Wait until at least `count` calls of method were recorded (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout), self._call_recorded:
            await self._call_recorded.wait_for(lambda: len(self.calls_to(method)) >= count)
        return self.calls_to(method)

    # -- HTTP ------------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        call = Call(method, *await _read_params(request), time=time.monotonic())
        self.calls.append(call)
        async with self._call_recorded:
            self._call_recorded.notify_all()
        if request.match_info["token"] != self.token:
            return _error(401, "Unauthorized")
        if self.latency:
            await asyncio.sleep(self.latency)
        if method.lower() in self._held:
            if self._held[method.lower()] > 0:
                self._held[method.lower()] -= 1
            else:
                await self._released.wait()
        if faults := self._faults[method.lower()]:
            fault = faults.popleft()
            if fault.status:
                return _error(fault.status, fault.description, fault.retry_after)
            if fault.done and (handler := self._methods.get(method.lower())) is not None:
                await handler(call)
            if request.transport is not None:
                request.transport.close()
            return web.Response()  # never reaches the client
        handler = self._methods.get(method.lower())
        if handler is None:
            return _error(404, "Not Found")
        try:
            result = await handler(call)
        except ApiError as exc:
            return _error(exc.status, exc.description)
        return web.json_response({"ok": True, "result": result})

    async def _not_found(self, request: web.Request) -> web.Response:
        return _error(404, "Not Found")

    async def _download(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return _error(401, "Unauthorized")
        path = request.match_info["path"]
        self.downloads.append(path)
        found = next((f for f in self.files.values() if f.file_path == path), None)
        if found is None:
            return _error(404, "Not Found")
        if self.download_flood is not None and not self.download_flood.done:
            return await self.download_flood.send(request)  # whatever getFile said its size is
        return web.Response(body=found.content, content_type="application/octet-stream")

    # -- methods ---------------------------------------------------------------------------

    def _bot_user(self) -> dict[str, Any]:
        bot_id = int(self.token.partition(":")[0])
        return {"id": bot_id, "is_bot": True, "first_name": "Roost", "username": self.bot_username}

    async def _get_me(self, call: Call) -> dict[str, Any]:
        flags = {
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
            "can_connect_to_business": False,
        }
        return self._bot_user() | flags

    async def _set_webhook(self, call: Call) -> bool:
        url = str(call.params.get("url") or "")
        if not url:  # as on Telegram, an empty url removes the webhook
            return await self._delete_webhook(call)
        if not url.startswith("https://"):
            raise _bad("bad webhook: An HTTPS URL must be provided for webhook")
        secret = call.params.get("secret_token")
        if secret is not None and not _SECRET.fullmatch(secret):
            raise _bad("secret token contains unallowed characters")
        await self._delete_webhook(call)  # drop_pending_updates
        self._set_allowed_updates(call)
        self.webhook = dict(call.params)
        return True

    async def _delete_webhook(self, call: Call) -> bool:
        if call.params.get("drop_pending_updates"):
            self._updates.clear()
        self.webhook = None
        return True

    async def _get_webhook_info(self, call: Call) -> dict[str, Any]:
        hook = self.webhook or {}  # like Telegram, the secret_token is never given back
        info = {
            "url": hook.get("url", ""),
            "has_custom_certificate": False,
            "pending_update_count": len(self._updates),
        }
        if hook:
            info["max_connections"] = hook.get("max_connections", 40)
        if hook and self.webhook_error:  # both fields are absent until a delivery fails
            info["last_error_date"] = int(time.time())
            info["last_error_message"] = self.webhook_error
        return info | {k: hook[k] for k in ("ip_address", "allowed_updates") if k in hook}

    async def _get_updates(self, call: Call) -> list[dict[str, Any]]:
        if self.webhook is not None:
            raise ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active;"
                " use deleteWebhook to delete the webhook first",
            )
        if offset := int(call.params.get("offset") or 0):  # confirms every update before it
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        self._set_allowed_updates(call)
        limit = min(max(int(call.params.get("limit") or 100), 1), 100)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(float(call.params.get("timeout") or 0), self.long_poll_cap)
        while True:
            self._update_queued.clear()
            if self._updates or loop.time() >= deadline:
                return self._updates[:limit]
            try:
                await asyncio.wait_for(self._update_queued.wait(), deadline - loop.time())
            except TimeoutError:
                pass

    def _set_allowed_updates(self, call: Call) -> None:
        """Telegram keeps allowed_updates until a later call changes it; pending updates stay."""
        if "allowed_updates" in call.params:
            self._allowed_updates = frozenset(call.params["allowed_updates"] or ())

    def _allowed(self, update: dict[str, Any]) -> bool:
        kinds = set(update) - {"update_id"}
        if self._allowed_updates:
            return bool(kinds & self._allowed_updates)
        return not kinds <= _OPT_IN_UPDATES

    async def _send_message(self, call: Call) -> dict[str, Any]:
        chat = self._chat(call)
        text = _plain_text(call.params, "text", MESSAGE_LIMIT)
        if not text.strip():
            raise _bad("message text is empty")
        fields: dict[str, Any] = {"text": text}
        if thread := call.params.get("message_thread_id"):
            if chat["type"] == "private":
                raise _bad("message thread not found")
            fields |= {"message_thread_id": thread, "is_topic_message": True}
        if reply := call.params.get("reply_parameters"):
            # The fake knows only the bot's own messages and those a test marks as posted:
            # anything else counts as deleted, which only allow_sending_without_reply forgives.
            replied = self.messages.get((chat["id"], int(reply.get("message_id") or 0)))
            if replied is not None:
                fields["reply_to_message"] = replied
            elif not reply.get("allow_sending_without_reply"):
                raise _bad("message to be replied not found")
        message = self._new_message(chat, call.params, **fields)
        self.sent_messages.append(call.params)
        return message

    async def _send_message_draft(self, call: Call) -> bool:
        chat = self._chat(call)
        if chat["type"] != "private":
            raise _bad("TEXTDRAFT_PEER_INVALID")
        draft_id = call.params.get("draft_id")
        if not isinstance(draft_id, int) or isinstance(draft_id, bool) or draft_id == 0:
            raise _bad("draft_id must be non-zero")
        text = _plain_text(call.params, "text", MESSAGE_LIMIT)
        self.drafts.append({"chat_id": chat["id"], "draft_id": draft_id, "text": text,
                            "message_thread_id": call.params.get("message_thread_id"),
                            "time": call.time})
        return True

    async def _edit_message_text(self, call: Call) -> dict[str, Any]:
        message = self._stored_message(call, "message to edit not found")
        text = _plain_text(call.params, "text", MESSAGE_LIMIT)
        markup = call.params.get("reply_markup", message.get("reply_markup"))
        if text == message.get("text") and markup == message.get("reply_markup"):
            raise _bad(
                "message is not modified: specified new message content and reply"
                " markup are exactly the same as a current content and reply markup"
                " of the message"
            )
        message |= {"text": text, "edit_date": int(time.time())}
        if markup is not None:
            message["reply_markup"] = markup
        return message

    async def _edit_message_reply_markup(self, call: Call) -> dict[str, Any]:
        message = self._stored_message(call, "message to edit not found")
        markup = call.params.get("reply_markup")
        if isinstance(markup, dict) and markup.get("inline_keyboard"):
            if message.get("reply_markup") == markup:
                raise _bad("message is not modified: specified new message content and reply "
                           "markup are exactly the same as a current content and reply markup "
                           "of the message")
            message["reply_markup"] = markup
        elif "reply_markup" in message:
            del message["reply_markup"]
        else:
            raise _bad("message is not modified: specified new message content and reply "
                       "markup are exactly the same as a current content and reply markup of "
                       "the message")
        return message

    async def _answer_callback_query(self, call: Call) -> bool:
        query_id = str(call.params.get("callback_query_id", ""))
        if query_id not in self.callback_answers or self.callback_answers[query_id] is not None:
            raise _bad("query is too old and response timeout expired or query ID is invalid")
        if len(str(call.params.get("text", ""))) > 200:
            raise _bad("MESSAGE_TOO_LONG")
        self.callback_answers[query_id] = call.params
        return True

    async def _delete_message(self, call: Call) -> bool:
        message = self._stored_message(call, "message to delete not found")
        del self.messages[message["chat"]["id"], message["message_id"]]
        return True

    def _stored_message(self, call: Call, missing: str) -> dict[str, Any]:
        key = (self._chat(call)["id"], int(call.params.get("message_id") or 0))
        if key not in self.messages:
            raise _bad(missing)
        return self.messages[key]

    async def _send_chat_action(self, call: Call) -> bool:
        self._chat(call)
        if not call.params.get("action"):
            raise _bad("action is empty")
        return True

    async def _send_photo(self, call: Call) -> dict[str, Any]:
        photo = self._sent_file(call, "photo")
        return self._send_media(call, photo=[photo.info() | {"width": 640, "height": 480}])

    async def _send_document(self, call: Call) -> dict[str, Any]:
        document = self._sent_file(call, "document")
        name = document.file_path.rpartition("/")[2]
        return self._send_media(call, document=document.info() | {"file_name": name})

    async def _send_voice(self, call: Call) -> dict[str, Any]:
        """A voice note: OGG/Opus (its upload kept, under `files`) shows as a Voice; another
        format goes out as a Document, as Telegram does with it."""
        voice = self._sent_file(call, "voice")
        if not voice.content.startswith(b"OggS"):
            return self._send_media(call, document=voice.info() | {"file_name": "voice"})
        duration = call.params.get("duration")
        return self._send_media(call, voice=voice.info() | {
            "duration": duration if isinstance(duration, int) else 0, "mime_type": "audio/ogg"})

    def _sent_file(self, call: Call, kind: str) -> _File:
        """The file a sendPhoto/sendDocument names: an upload (kept for getFile) or a file_id."""
        if kind in call.files:
            file_id = f"{kind}-{len(self.files) + 1}"
            self.add_file(file_id, call.files[kind], f"{kind}s/{file_id}")
            return self.files[file_id]
        reference = str(call.params.get(kind) or "")
        if reference not in self.files:  # a URL too: the fake fetches nothing
            raise _bad("wrong file identifier/HTTP URL specified")
        return self.files[reference]

    def _send_media(self, call: Call, **media: Any) -> dict[str, Any]:
        if "caption" in call.params:
            media["caption"] = _plain_text(call.params, "caption", CAPTION_LIMIT)
        return self._new_message(self._chat(call), call.params, **media)

    async def _get_file(self, call: Call) -> dict[str, Any]:
        stored = self.files.get(str(call.params.get("file_id") or ""))
        if stored is None:
            raise _bad("invalid file_id")
        return stored.info() | {"file_path": stored.file_path}

    async def _set_my_commands(self, call: Call) -> bool:
        commands = call.params.get("commands") or []
        for command in commands:
            if not _COMMAND.fullmatch(str(command.get("command", ""))):
                raise _bad("BOT_COMMAND_INVALID")
            if not 1 <= len(str(command.get("description", ""))) <= 256:
                raise _bad("command description must be non-empty")
        self.commands = list(commands)
        return True

    def _chat(self, call: Call) -> dict[str, Any]:
        """The Chat object Telegram would put in a message to the call's chat_id; 403 for a
        private chat the bot may not write to."""
        chat_id = call.params.get("chat_id")
        if chat_id in (None, ""):
            raise _bad("chat_id is empty")
        if not isinstance(chat_id, int):  # @channelusername: roost only talks to numeric ids
            raise _bad("chat not found")
        if chat_id > 0:
            if chat_id in self.blocked:
                raise ApiError(403, "Forbidden: bot was blocked by the user")
            if chat_id not in self.started:
                raise ApiError(403, "Forbidden: bot can't initiate conversation with a user")
            return {"id": chat_id, "type": "private", "first_name": "Test"}
        kind = "supergroup" if str(chat_id).startswith("-100") else "group"
        return {"id": chat_id, "type": kind, "title": "Test group"}

    def _new_message(
        self, chat: dict[str, Any], params: dict[str, Any], **fields: Any
    ) -> dict[str, Any]:
        """A Message from the bot in chat, with the chat's next message_id; kept."""
        self._last_message_id[chat["id"]] += 1
        message_id = self._last_message_id[chat["id"]]
        message = {
            "message_id": message_id,
            "from": self._bot_user(),
            "chat": chat,
            "date": int(time.time()),
            **fields,
        }
        markup = params.get("reply_markup")
        if isinstance(markup, dict) and "inline_keyboard" in markup:  # only these come back
            message["reply_markup"] = markup
        self.messages[chat["id"], message_id] = message
        return message


def _plain_text(params: dict[str, Any], name: str, limit: int) -> str:
    """The text as Telegram shows it (HTML parsed), or Telegram's 400 for a bad or long one."""
    text = str(params.get(name) or "")
    if name == "text" and len(text.encode()) > RAW_TEXT_LIMIT:
        raise _bad("message is too long")
    if params.get("parse_mode") == "HTML":
        text = parse_html(text)
    elif params.get("parse_mode") not in (None, "", "Markdown", "MarkdownV2"):
        raise _bad("unsupported parse_mode")
    if len(text) > limit:
        raise _bad("message is too long" if name == "text" else "message caption is too long")
    return text


def parse_html(text: str) -> str:
    """The plain text of Telegram HTML; ApiError with Telegram's wording when it is invalid."""
    out: list[str] = []
    open_tags: list[str] = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char == "&" and (entity := _ENTITY.match(text, pos)):
            decoded = _decode_entity(entity.group(1))
            if decoded is not None:
                out.append(decoded)
                pos = entity.end()
                continue
        if char != "<":  # also a lone "&" or an unknown entity: Telegram keeps them as text
            out.append(char)
            pos += 1
            continue
        at = len(text[:pos].encode())
        if (tag := _TAG.match(text, pos)) is None:
            kind = "end" if text.startswith("</", pos) else "start"
            raise _parse_error(f"Unclosed {kind} tag at byte offset {at}")
        closing, name, attrs = tag.group(1), tag.group(2).lower(), tag.group(3)
        if not closing:
            if name not in _HTML_TAGS:
                raise _parse_error(f'Unsupported start tag "{name}" at byte offset {at}')
            if name == "span" and not _SPOILER_CLASS.search(attrs):
                raise _parse_error(f'Tag "span" must have class "tg-spoiler" at byte offset {at}')
            open_tags.append(name)
        elif not open_tags:
            raise _parse_error(f"Unexpected end tag at byte offset {at}")
        elif name and name != open_tags[-1]:
            raise _parse_error(
                f'Unmatched end tag at byte offset {at}, expected "</{open_tags[-1]}>",'
                f' found "</{name}>"'
            )
        else:
            open_tags.pop()
        pos = tag.end()
    if open_tags:
        raise _parse_error(f'Can\'t find end tag corresponding to start tag "{open_tags[-1]}"')
    return "".join(out)


def _parse_error(reason: str) -> ApiError:
    return _bad(f"can't parse entities: {reason}")


def _decode_entity(body: str) -> str | None:
    if not body.startswith("#"):
        return _NAMED_ENTITIES.get(body)
    code = int(body[2:], 16) if body[1:2] == "x" else int(body[1:])
    return chr(code) if 0 < code <= 0x10FFFF else None


def _decode(name: str, value: str) -> Any:
    if name in _TEXT_PARAMS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value  # a bare string, e.g. chat_id="@channel"


async def _read_params(request: web.Request) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Parameters (JSON values decoded) and uploaded files of one call."""
    params: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    if request.content_type == "multipart/form-data":
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            if part.filename is not None:
                files[part.name] = bytes(await part.read())
            else:
                params[part.name] = _decode(part.name, await part.text())
    elif request.body_exists:
        form = parse_qsl(await request.text(), keep_blank_values=True)
        params = {k: _decode(k, v) for k, v in form}
    return params, files


def _error(status: int, description: str, retry_after: int | None = None) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if retry_after is not None:
        body["parameters"] = {"retry_after": retry_after}
    return web.json_response(body, status=status)
