"""`roost init`'s part for Matrix: the homeserver, the bot's account and its secret, each
checked with the homeserver, and the owner's own user id, let in by `matrix.allow` so that
they need no pairing.

The login is checked without leaving anything behind in the bot's list of sessions. A password
is tried by a real login (nothing else proves it), whose device is logged out at once: logging
out deletes the device on the homeserver, and roost's own first start then logs in on the
device it keeps (channels/matrix/session.py). An access token is checked by `whoami`, which
makes no device. Plain HTTP (aiohttp), not matrix-nio: a login made by nio would also upload
encryption keys for a device about to be deleted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import aiohttp

from channels.matrix.platform import USER_ID
from daemon.core.checks import network_reason
from daemon.core.setup import (
    EX_CONFIG,
    EX_UNAVAILABLE,
    TRIES,
    Asker,
    SetUp,
    SetupRequest,
    SetupStop,
    Value,
)

CLIENT = "/_matrix/client"
TIMEOUT = aiohttp.ClientTimeout(total=15)
CHECK_DEVICE = "roost init (a check of the password, logged out at once)"


async def set_up(request: SetupRequest) -> SetUp:
    asker, options = request.asker, request.options
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        homeserver = await _homeserver(session, asker, options["matrix_homeserver"])
        user_id = _user_id(asker, options["matrix_user"], "--matrix-user", "The bot's user id "
                           "(such as @roost:example.org)")
        if user_id is None:
            raise SetupStop("Matrix needs the bot's user id (--matrix-user, such as "
                            "@roost:example.org)", EX_CONFIG)
        secret = await _secret(session, asker, request.env, homeserver, user_id)
    owner = _user_id(asker, options["matrix_owner"], "--matrix-owner", "Your own Matrix user "
                     "id (roost answers it without pairing; empty: pair later)")
    table: dict[str, Value] = {"homeserver": homeserver, "user_id": user_id}
    if owner:
        table["allow"] = (owner,)
    return SetUp(table, secret)


async def _call(session: aiohttp.ClientSession, method: str, url: str, *,
                token: str | None = None,
                body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON object answered; empty when it was none). Network trouble raises
    aiohttp.ClientError or TimeoutError."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.request(method, url, json=body, headers=headers) as response:
        try:
            answer = await response.json(content_type=None)
        except ValueError:
            answer = None
        return response.status, answer if isinstance(answer, dict) else {}


def _said(status: int, answer: dict[str, Any]) -> str:
    """The homeserver's own words for a refusal: `M_FORBIDDEN: Invalid password`."""
    words = ": ".join(str(answer[k]) for k in ("errcode", "error") if answer.get(k))
    return words or f"HTTP {status}"


async def _homeserver(session: aiohttp.ClientSession, asker: Asker, given: str | None) -> str:
    """The base URL of a server that answers `GET /_matrix/client/versions`."""
    url = given or ""
    for attempt in range(TRIES):
        if not url and asker.interactive:
            url = asker.ask("Your homeserver's address (such as https://matrix.example.org)")
        url = url.strip().rstrip("/")
        last = not asker.interactive or attempt == TRIES - 1
        if not url:
            problem = "Matrix needs the homeserver's address (--matrix-homeserver)"
            status = EX_CONFIG
        elif not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            problem = f"{url!r} is not an address such as https://matrix.example.org"
            status = EX_CONFIG
        else:
            try:
                code, answer = await _call(session, "GET", f"{url}{CLIENT}/versions")
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = (f"cannot reach the homeserver at {url} ({network_reason(exc)}): "
                           "check this machine's network, or the address")
                status = EX_UNAVAILABLE
            else:
                if code == 200 and isinstance(answer.get("versions"), list):
                    asker.say(f"Matrix: {url} is a homeserver (client API "
                              f"{', '.join(map(str, answer['versions'][-2:]))})")
                    return url
                problem = (f"{url} does not answer as a Matrix homeserver (GET "
                           f"{CLIENT}/versions: {_said(code, answer)}): give its client "
                           "address (--matrix-homeserver)")
                status = EX_CONFIG
        if last:
            raise SetupStop(problem, status)
        asker.say(problem)
        url = ""
    raise AssertionError("unreachable")


def _user_id(asker: Asker, given: str | None, flag: str, question: str) -> str | None:
    """A Matrix user id (`@name:server`), or None when none is given."""
    for _ in range(TRIES):
        if given is None and asker.interactive:
            given = asker.ask(question)
        user_id = (given or "").strip()
        if not user_id or re.fullmatch(USER_ID, user_id):
            return user_id or None
        if not asker.interactive:
            raise SetupStop(f"{flag} {given!r} is not a Matrix user id (such as "
                            "@dana:example.org)", EX_CONFIG)
        asker.say("That is not a Matrix user id: @, the name, a colon and the server, such "
                  "as @dana:example.org")
        given = None
    raise SetupStop("no usable Matrix user id", 1)


async def _secret(session: aiohttp.ClientSession, asker: Asker, env: Mapping[str, str],
                  homeserver: str, user_id: str) -> dict[str, str]:
    """The bot's password (or access token), as the homeserver accepts it for `user_id`."""
    password = env.get("ROOST_MATRIX_PASSWORD", "").strip()
    token = "" if password else env.get("ROOST_MATRIX_TOKEN", "").strip()
    if not password and not token and not asker.interactive:
        raise SetupStop("Matrix needs the bot's password in ROOST_MATRIX_PASSWORD (or an "
                        "access token in ROOST_MATRIX_TOKEN)", EX_CONFIG)
    for attempt in range(TRIES):
        if not password and not token:
            password = asker.ask(f"{user_id}'s password (empty: give an access token "
                                 "instead)", hidden=True)
            token = "" if password else asker.ask("Access token", hidden=True)
            if not password and not token:
                continue
        problem = (await _check_password(session, homeserver, user_id, password, asker)
                   if password else await _check_token(session, homeserver, user_id, token))
        if problem is None:
            return ({"ROOST_MATRIX_PASSWORD": password} if password
                    else {"ROOST_MATRIX_TOKEN": token})
        if not asker.interactive or attempt == TRIES - 1:
            raise SetupStop(problem, EX_CONFIG)
        asker.say(problem)
        password = token = ""
    raise SetupStop("no password or access token the homeserver takes", 1)


async def _check_password(session: aiohttp.ClientSession, homeserver: str, user_id: str,
                          password: str, asker: Asker) -> str | None:
    """None when the homeserver takes the password for `user_id`, else what it said. The
    login's device is logged out (so deleted) before this returns."""
    login = f"{homeserver}{CLIENT}/v3/login"
    try:
        code, flows = await _call(session, "GET", login)
        kinds = [f.get("type") for f in flows.get("flows", []) if isinstance(f, dict)]
        if code == 200 and "m.login.password" not in kinds:
            raise SetupStop(f"{homeserver} takes no password login (it offers "
                            f"{', '.join(map(str, kinds)) or 'nothing'}): give the bot's "
                            "access token as ROOST_MATRIX_TOKEN instead", EX_CONFIG)
        code, answer = await _call(session, "POST", login, body={
            "type": "m.login.password", "identifier": {"type": "m.id.user", "user": user_id},
            "password": password, "initial_device_display_name": CHECK_DEVICE})
        if code != 200 or not answer.get("access_token"):
            if code == 429 or code >= 500:
                raise SetupStop(f"{homeserver} could not check the password now "
                                f"({_said(code, answer)}); try again later", EX_UNAVAILABLE)
            return f"the homeserver refused the password of {user_id} ({_said(code, answer)})"
        token = str(answer["access_token"])
        code, left = await _call(session, "POST", f"{homeserver}{CLIENT}/v3/logout", token=token,
                                 body={})
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SetupStop(f"cannot reach the homeserver at {homeserver} "
                        f"({network_reason(exc)})", EX_UNAVAILABLE) from None
    if code != 200:
        asker.say(f"Matrix: logging out of the check's device {answer.get('device_id')} "
                  f"failed ({_said(code, left)}); remove it in your client's list of "
                  f"{user_id}'s sessions")
    return _same_user(user_id, str(answer.get("user_id", "")), "the password")


async def _check_token(session: aiohttp.ClientSession, homeserver: str, user_id: str,
                       token: str) -> str | None:
    """None when the access token is valid and belongs to `user_id`, else what is wrong."""
    try:
        code, answer = await _call(session, "GET", f"{homeserver}{CLIENT}/v3/account/whoami",
                                   token=token)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SetupStop(f"cannot reach the homeserver at {homeserver} "
                        f"({network_reason(exc)})", EX_UNAVAILABLE) from None
    if code == 429 or code >= 500:
        raise SetupStop(f"{homeserver} could not check the access token now "
                        f"({_said(code, answer)}); try again later", EX_UNAVAILABLE)
    if code != 200:
        return f"the homeserver refused the access token ({_said(code, answer)})"
    return _same_user(user_id, str(answer.get("user_id", "")), "the access token")


def _same_user(user_id: str, found: str, what: str) -> str | None:
    if found != user_id:
        return f"{what} is {found or 'nobody'}'s, not {user_id}'s: give the bot's own"
    return None
