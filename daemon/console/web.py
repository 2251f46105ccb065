"""The console's routes on roost's own aiohttp server, under `/console/`.

No page answers without a session: a browser gets one by a single-use link (`roost console`
for the owner, `/console` in a chat for that person: the owner's view for the household's owner,
checked again at every request, signin.py), opened with a button so that a link preview that
fetches the address does not use the link up. Every response carries a strict
Content-Security-Policy (no script at all) and is not cached; every form carries the session's
token.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from aiohttp import web

from daemon.console import conversation_page, signin, transcript, views
from daemon.console.board import AutomationBoard, HealthView
from daemon.console.compression import compress
from daemon.console.names import ChatName, chat_names, name_of
from daemon.console.notices import Notices
from daemon.console.paging import PER_PAGE
from daemon.console.people import People
from daemon.core.config import Settings
from daemon.core.conversations import Conversation
from daemon.core.logs import http_log as log
from daemon.store import Store
from daemon.store.console_keys import LINK_TTL, ConsoleKeys, ConsoleSession

PREFIX = "/console"
COOKIE = "roost_console"
HEADERS = {
    # Pictures and voice notes come from roost's own file route only; still no script at all.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "media-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # Nothing to other sites, and a true Origin on roost's own forms (no-referrer makes every
    # form's Origin "null", which the sign-in cannot tell from another site's page).
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# What an error page says where the handler gave no reason of its own.
ERROR_WORDS = {404: "There is no such page here.",
               405: "This address answers a button on a console page, not a link."}
_HERE = Path(__file__).parent
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Page = Callable[[web.Request, ConsoleSession], Awaitable[web.StreamResponse]]


class Console:
    """The console's handlers over one store and one settings."""

    def __init__(self, settings: Settings, store: Callable[[], Store], *,
                 board: Callable[[], AutomationBoard] | None = None,
                 health: Callable[[], HealthView] | None = None,
                 reminders: Callable[[str], Awaitable[list[dict[str, Any]]]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store  # the app's store, once it is open
        self.board = board
        self.health = health  # synchronous: called in a thread
        self.reminders = reminders  # a chat's pending reminders
        self.notices = Notices()
        self.people = People(settings, clock)
        self.sessions = signin.Sessions(ConsoleKeys(settings.daemon.state_dir),
                                        self.people.household.role_of, clock)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True, undefined=jinja2.StrictUndefined)
        # The one way HTML reaches a page unescaped: markdown through the console's own
        # renderer (raw HTML off, links judged; transcript.py).
        self.templates.filters["markdown"] = transcript.render
        self.templates.filters["markdown_inline"] = transcript.render_inline
        # Read once at start-up, so that serving it (compressed) touches no file on the loop.
        self.css = (_HERE / "static" / "console.css").read_bytes()

    def add_routes(self, app: web.Application) -> None:
        app.middlewares.append(self.headers)
        app.router.add_get(f"{PREFIX}/login", self.login_page)
        app.router.add_post(f"{PREFIX}/login", self.login)
        app.router.add_post(f"{PREFIX}/logout", self._signed_in(self.logout))
        app.router.add_get(f"{PREFIX}/static/console.css", self.stylesheet)
        app.router.add_get(PREFIX, self.to_index)
        app.router.add_get(f"{PREFIX}/", self._signed_in(self.conversations))
        app.router.add_get(f"{PREFIX}/c/{{cid}}", self._signed_in(self.conversation))
        app.router.add_get(f"{PREFIX}/people", self._signed_in(self.people_page))
        app.router.add_get(f"{PREFIX}/automations", self._signed_in(self.automations))
        app.router.add_get(f"{PREFIX}/health", self._signed_in(self.health_page))
        app.router.add_post(f"{PREFIX}/automations/run", self._signed_in(self.run_now))
        app.router.add_post(f"{PREFIX}/people/{{action}}", self._signed_in(self.people_form))
        app.router.add_get(f"{PREFIX}/c/{{cid}}/file/{{seq:[0-9]{{1,9}}}}/{{index:[0-9]{{1,4}}}}",
                           self._signed_in(self.download))

    # ---- the guard ----------------------------------------------------------------------

    @web.middleware
    async def headers(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The console's headers on every answer under /console; an error as a page in the
        console's layout, with a way back."""
        ours = request.path == PREFIX or request.path.startswith(f"{PREFIX}/")
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPException as exc:
            if not ours:
                raise
            if exc.status < 400:  # a redirect
                exc.headers.update(HEADERS)
                raise
            response = await self._error_page(request, exc)
        except Exception:
            if not ours:
                raise
            # A bug of roost's: logged with its traceback; the person gets a page, not a trace.
            log.exception("console page %s failed", request.path)
            response = await self._error_page(request, web.HTTPInternalServerError(
                text="Something went wrong on roost's side; it is in roost's log. Try again, "
                     "or go back."))
        if ours:
            response.headers.update(HEADERS)
            compress(request, response)
        return response

    async def _error_page(self, request: web.Request, exc: web.HTTPException) -> web.Response:
        # aiohttp's own answers ("404: Not Found") get words; a handler's reason is kept.
        text = exc.text or ""
        if not text or text.startswith(f"{exc.status}:"):
            text = ERROR_WORDS.get(exc.status, "Something went wrong with this request.")
        session = await self._session(request)  # a signed-in page keeps its header
        response = self._page("message.html", status=exc.status, text=text, title=exc.reason,
                              **({"session": session} if session is not None else {}))
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response

    def _signed_in(self, page: Page) -> Handler:
        """`page` for a browser with a session (and, for a form, the session's token)."""
        async def handler(request: web.Request) -> web.StreamResponse:
            session = await self._session(request)
            if session is None:
                return self._page("signin.html", status=401, signed_out=True)
            if request.method == "POST" and not _same(await _form_token(request),
                                                      session.csrf):
                return self._page("message.html", status=403,
                                  text="This form has expired. Reload the page and try again.")
            return await page(request, session)
        return handler

    async def _session(self, request: web.Request) -> ConsoleSession | None:
        token = request.cookies.get(COOKIE)
        if not token:
            return None
        return await asyncio.to_thread(self.sessions.session, token)

    # ---- signing in and out -------------------------------------------------------------

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        link = request.query.get("t", "")
        nonce = signin.browser_nonce(request.cookies.get(signin.COOKIE))
        token = self.sessions.forms.token(nonce, link)
        response = self._page("signin.html", link=link, signed_out=False,
                              token_field=signin.FIELD, token=token)
        response.set_cookie(signin.COOKIE, nonce, path=f"{PREFIX}/login", httponly=True,
                            samesite="Strict",
                            secure=signin.secure(request, self.settings.console.url),
                            max_age=int(LINK_TTL))
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        link = str(form.get("t", ""))
        # Another site posting a link of its own would sign this browser in as someone else
        # (login CSRF): only a press on roost's own page, in this browser, counts (signin.py).
        if not (signin.pressed_on_our_page(
                request.headers, signin.our_hosts(request.host, self.settings.console.url))
                and self.sessions.forms.valid(request.cookies.get(signin.COOKIE), link,
                                              str(form.get(signin.FIELD, "")))):
            return self._page("message.html", status=403, text=(
                "This sign-in did not come from roost's own page. Open your sign-in link "
                "again and press Sign in there (the link still works)."))
        made = await asyncio.to_thread(self.sessions.redeem, link)
        if isinstance(made, str):
            return self._page("message.html", status=403, text=made)
        token, session = made
        response = _see_other(f"{PREFIX}/")
        response.set_cookie(COOKIE, token, path=PREFIX, httponly=True, samesite="Strict",
                            secure=signin.secure(request, self.settings.console.url),
                            max_age=int(session.expires - session.created))
        response.del_cookie(signin.COOKIE, path=f"{PREFIX}/login")
        return response

    async def logout(self, request: web.Request,
                     session: ConsoleSession) -> web.StreamResponse:
        await asyncio.to_thread(self.sessions.end, request.cookies.get(COOKIE, ""))
        response = _see_other(f"{PREFIX}/login")
        response.del_cookie(COOKIE, path=PREFIX)
        return response

    # ---- pages --------------------------------------------------------------------------

    async def to_index(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(f"{PREFIX}/")

    async def stylesheet(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.css, content_type="text/css", charset="utf-8")

    async def conversations(self, request: web.Request,
                            session: ConsoleSession) -> web.StreamResponse:
        page = _number(request.query.get("page", "0")) or 0
        names = await asyncio.to_thread(self._names)
        rows, older = await asyncio.to_thread(
            views.conversation_rows, self.store(), session.covers, self.settings.model.name,
            self.settings.daemon.tz, page, names)
        return self._page("conversations.html", session=session, rows=rows, page=page,
                          older=older)

    async def conversation(self, request: web.Request,
                           session: ConsoleSession) -> web.StreamResponse:
        conversation = await self._covered(request, session, "No such conversation.")
        reading = await asyncio.to_thread(conversation_page.read, self.store(), conversation,
                                          self.settings)
        reminders = (views.reminder_lines(await self.reminders(conversation.chat_key),
                                          self.settings.daemon.tz)
                     if self.reminders is not None and conversation.status == "active" else [])
        names = await asyncio.to_thread(self._names)
        number = _number(request.query.get("page", "0")) or 0
        # Markdown and templates for a page of messages: CPU work kept off the loop.
        body = await asyncio.to_thread(self.conversation_html, session, reading, names,
                                       number, reminders=reminders)
        return web.Response(text=body, content_type="text/html", headers=HEADERS)

    def conversation_html(self, session: ConsoleSession, reading: conversation_page.Reading,
                          names: dict[str, str], number: int, per_page: int = PER_PAGE,
                          reminders: Sequence[str] = ()) -> str:
        """Page `number` of a conversation (synchronous; see conversation_page.values)."""
        return self._render("conversation.html", session=session, **conversation_page.values(
            self.settings, reading, names, number, per_page, reminders))

    async def download(self, request: web.Request,
                       session: ConsoleSession) -> web.StreamResponse:
        conversation = await self._covered(request, session, "No such file.")
        seq, index = int(request.match_info["seq"]), int(request.match_info["index"])
        path, doc = await asyncio.to_thread(conversation_page.stored_file, self.store(),
                                            conversation, seq, index)
        name = str(doc.get("name") or path.name)
        if views.attachment_view(doc, index).shown_as != "file":
            # A picture or a sound of a type on views.INLINE_TYPES' short list: shown in the
            # page by <img>/<audio>, under the CSP's img-src/media-src 'self'.
            return web.FileResponse(path, headers={
                "Content-Type": str(doc["mime"]),
                "Content-Disposition": _disposition("inline", name)})
        # Served as a download, never rendered in roost's origin: a stored HTML file stays inert.
        return web.FileResponse(path, headers={
            "Content-Type": "application/octet-stream",
            "Content-Disposition": _disposition("attachment", name)})

    async def _covered(self, request: web.Request, session: ConsoleSession,
                       missing: str) -> Conversation:
        """The conversation the address names, if the session may see it; else 404, as for
        one that does not exist."""
        conversation = await asyncio.to_thread(self.store().get_conversation,
                                               request.match_info["cid"])
        if conversation is None or not session.covers(conversation.chat_key):
            raise web.HTTPNotFound(text=missing)
        return conversation

    async def people_page(self, request: web.Request,
                          session: ConsoleSession) -> web.StreamResponse:
        shown = await asyncio.to_thread(self.people.view, session)
        return self._page("people.html", session=session, done=self._notice(request, session),
                          named=await self._named(), **shown)

    async def people_form(self, request: web.Request,
                          session: ConsoleSession) -> web.StreamResponse:
        form = await request.post()
        field = {k: str(v) for k, v in form.items()}
        action = request.match_info["action"]
        people = self.people
        if action in ("approve", "deny"):
            done = await asyncio.to_thread(people.decide, session, field.get("code", ""),
                                           action == "approve")
        elif action == "revoke":
            done = await asyncio.to_thread(people.revoke, session, field.get("person", ""),
                                           field.get("tool", ""))
        elif action == "forget":
            done = await asyncio.to_thread(people.forget, session, field.get("person", ""),
                                           field.get("text", ""))
        elif action == "remember":
            done = await asyncio.to_thread(people.remember, session, field.get("person", ""),
                                           field.get("text", ""))
        else:
            raise web.HTTPNotFound(text="No such action.")
        return self._back(f"{PREFIX}/people", session, done)

    async def automations(self, request: web.Request,
                          session: ConsoleSession) -> web.StreamResponse:
        board = self._owners_board(session)
        shown = await asyncio.to_thread(board.overview)
        return self._page("automations.html", session=session, automations=shown,
                          done=self._notice(request, session), named=await self._named())

    async def run_now(self, request: web.Request,
                      session: ConsoleSession) -> web.StreamResponse:
        board = self._owners_board(session)
        name = str((await request.post()).get("name", ""))
        done = await board.run_now(name)
        return self._back(f"{PREFIX}/automations", session, done)

    async def health_page(self, request: web.Request,
                          session: ConsoleSession) -> web.StreamResponse:
        if not session.is_owner or self.health is None:
            raise web.HTTPNotFound(text="The daemon's health is the owner's to see.")
        return self._page("health.html", session=session,
                          health=await asyncio.to_thread(self.health))

    def _back(self, page: str, session: ConsoleSession, done: str) -> web.Response:
        """Back to the page with what happened (POST, redirect, GET: a reload sends nothing
        twice); the words stay here, the address names them by a key (notices.py)."""
        return _see_other(f"{page}?{urlencode({'done': self.notices.put(session.csrf, done)})}")

    def _notice(self, request: web.Request, session: ConsoleSession) -> str:
        return self.notices.text(session.csrf, request.query.get("done", ""))

    def _names(self) -> dict[str, str]:
        """Chat key -> the name roost knows (synchronous: reads the pairing book)."""
        return chat_names(self.settings.linked, self.people.pairing)

    async def _named(self) -> Callable[[str], ChatName]:
        """A chat key's name for a template (`named(key).name`, the key in small print)."""
        names = await asyncio.to_thread(self._names)
        return lambda key: name_of(key, names)

    def _owners_board(self, session: ConsoleSession) -> AutomationBoard:
        if not session.is_owner or self.board is None:
            raise web.HTTPNotFound(text="The automations are the owner's to see.")
        return self.board()

    def _page(self, template: str, *, status: int = 200, **values: Any) -> web.Response:
        return web.Response(text=self._render(template, **values), status=status,
                            content_type="text/html", headers=HEADERS)

    def _render(self, template: str, **values: Any) -> str:
        # Every time on every page is in the daemon's zone, which the page names once.
        return self.templates.get_template(template).render(
            prefix=PREFIX, zone=self.settings.daemon.timezone, **values)


async def _form_token(request: web.Request) -> str:
    return str((await request.post()).get("csrf", ""))


def _same(given: str, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def _number(text: str) -> int | None:
    """A small plain number from a form or query (int() takes "²" and refuses huge ones)."""
    return int(text) if re.fullmatch(r"[0-9]{1,6}", text) else None


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _disposition(how: str, name: str) -> str:
    return f"{how}; filename*=UTF-8''{quote(name, safe='')}"
