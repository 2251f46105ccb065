"""A pool of Ollama hosts (`[model] hosts`), each conversation pinned to the host of its cache.

Ollama keeps a model's prompt cache on the host that evaluated the prompt: a conversation that
moves pays for its whole prompt again, and an automation's byte-stable prefix is cheap only
where it was cached. A balancer in front of Ollama cannot know that, so roost chooses the host,
per *route*:

* A route is the key of the work that shares a cache: a conversation's id (its turns and its
  folds), or `automation:NAME` (an automation's chat key) for all of its runs. A call without a
  route (a probe, the doctor, /model) goes to the best host up and pins nothing.
* A new route takes the best host that is up and may serve the model (its `models`, and what
  `/api/tags` lists once asked): the highest `priority`; then one with a free slot (fewer than
  `model.concurrency` routes or calls under way there); then one with the model loaded
  (`/api/ps`, or a call it answered); then the least load; then config order. The route is
  pinned there and every call of it goes there while the host is up.
* A call a host failed (refused connection, 5xx, silence) marks the host down; `fail_over`
  pins the route to the next host up with the model and remembers its home. A host that comes
  back serves new routes at once; a displaced route goes home only once its `fold` changed (the
  conversation folded, or the automation ran again: the prompt's start changes and its cache is
  rebuilt anyway), so no cache is thrown away twice. With every host down, a call goes to the
  route's own host (or the best by config) and fails there, as with one host.
* The health check (`start`, `close`) asks each host `/api/tags`, `/api/ps` and `/api/version`
  every `every` seconds (a host down, every `down_every`), each question bounded by
  `check_timeout`; it never raises.
* Pins live in memory (the newest `PINS_KEPT`). A reply's meta keeps the host that served it
  (`host`): a route without a pin takes that host back while it is up (`hint`), so a restart
  keeps the caches warm.
* A pool of one is roost as it always was: every call goes to its host whatever its state, and
  no health check runs.

What the surfaces read (/status, doctor, /metrics, the console): `HostPool.hosts`, each `Host`
with `name` (the URL, credentials hidden), `priority`, `up`, `error`, `down_since`, `checked_at`,
`models` (None until asked), `loaded` (model -> size_vram), `version_text`, `in_flight`; and
`host_of(route)`, `routes_on(host)`, `home_of(route)`, `hosts_with(model)`, `check_all()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import httpx
import ollama

from daemon.core.bodies import MB
from daemon.core.capped_http import capped_transport
from daemon.core.config.sections import HostSettings
from daemon.core.errors import ModelNowhere
from daemon.core.logs import llm_log as log
from daemon.core.redact import redact_url

CHECK_EVERY = 30.0  # seconds between two health checks of a host that is up
CHECK_DOWN_EVERY = 5.0  # ... of a host that is down: it serves again soon after it is back
CHECK_TIMEOUT = 5.0  # seconds one question of the health check may take
VERSION_TIMEOUT = 10.0
CHECK_CAP = 4 * MB  # a health answer (the list of models) larger than this is a server gone wrong
PINS_KEPT = 4096  # routes remembered; an older one finds its host again by the reply's hint

# What the ollama client raises, and lets through from httpx: its ResponseError/RequestError,
# ConnectionError for a refused connection (an OSError), httpx's transport errors (timeouts,
# dropped connections), and ValueError for a line or an answer that does not parse (json,
# pydantic). These alone become LLMErrors; anything else is a bug and travels as itself.
OLLAMA_ERRORS: tuple[type[Exception], ...] = (
    ollama.ResponseError, ollama.RequestError, httpx.HTTPError, OSError, ValueError)
# ... and a health question's bound (asyncio.timeout).
_CHECK_ERRORS: tuple[type[Exception], ...] = (*OLLAMA_ERRORS, TimeoutError)


class Route(NamedTuple):
    """Where a piece of work's calls go: its `key` (a conversation's id, `automation:NAME`),
    its `fold` (the conversation's fold count: a displaced route goes home once it changed),
    and the `hint` (the host that served it last, for a route without a pin)."""

    key: str
    fold: int = 0
    hint: str | None = None


def tagged(model: str) -> str:
    """A model's name as /api/tags lists it: without a tag, Ollama means `:latest`."""
    return model if ":" in model else f"{model}:latest"


def version_numbers(text: str) -> tuple[int, ...]:
    """`0.12.6` -> (0, 12, 6); `0.13.0-rc1` -> (0, 13, 0); () for what is no version."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    return tuple(int(g) for g in match.groups("0")) if match else ()


class Host:
    """One Ollama server of the pool: its client and what roost knows of it."""

    def __init__(self, settings: HostSettings, index: int, client: ollama.AsyncClient) -> None:
        self.url = settings.url  # with its credentials, for requests only
        self.name = redact_url(settings.url)  # for messages, logs and a reply's meta
        self.priority = settings.priority
        self.allowed = frozenset(tagged(m) for m in settings.models)  # empty: any it has
        self.index = index  # config order: the last tie-break
        self.client = client
        self.up = True  # until a call or a check fails
        self.error: str | None = None  # why it is down
        self.down_since: float | None = None  # wall clock
        self.checked_at: float | None = None  # the last health check it answered
        self.models: frozenset[str] | None = None  # /api/tags; None until asked
        self.missing: set[str] = set()  # models it answered 404 for since its last /api/tags
        self.loaded: dict[str, int | None] = {}  # /api/ps: model -> size_vram (None: not said)
        self.version: tuple[int, ...] | None = None  # /api/version; None: not known, (): not said
        self.version_text: str | None = None
        self.in_flight = 0  # calls at it now
        self.unrouted = 0  # of those, the ones without a route (they count as load)
        self.changed = asyncio.Event()  # set when it goes down: its next check comes sooner

    def may_serve(self, model: str) -> bool:
        """Allowed by its `models`, and not known to lack it."""
        name = tagged(model)
        return ((not self.allowed or name in self.allowed) and name not in self.missing
                and (self.models is None or name in self.models))

    def has_loaded(self, model: str) -> bool:
        return tagged(model) in self.loaded


@dataclass
class _Pin:
    host: Host
    home: Host | None = None  # where the route was before a failure moved it
    fold: int = 0  # its fold when it moved


class HostPool:
    """The Ollama hosts and the routes pinned to them; see the module docstring. `client_for`
    makes a host's `ollama.AsyncClient` from its URL; `slots` is `model.concurrency`."""

    def __init__(self, hosts: Sequence[HostSettings],
                 client_for: Callable[[str], ollama.AsyncClient], *, slots: int = 1,
                 every: float = CHECK_EVERY, down_every: float = CHECK_DOWN_EVERY,
                 check_timeout: float = CHECK_TIMEOUT,
                 clock: Callable[[], float] = time.time) -> None:
        self.hosts = tuple(Host(h, i, client_for(h.url)) for i, h in enumerate(hosts))
        self.slots = slots
        self.every, self.down_every, self.check_timeout = every, down_every, check_timeout
        self.clock = clock
        self._pins: OrderedDict[str, _Pin] = OrderedDict()
        self._active: Counter[str] = Counter()  # routes being served now (`enter`, `leave`)
        self._watches: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def several(self) -> bool:
        return len(self.hosts) > 1

    # ---- routing ------------------------------------------------------------------------

    def host_for(self, route: str | None, model: str, *, fold: int = 0,
                 hint: str | None = None) -> Host:
        """The host for a call of `route` to `model` (see the module docstring), pinning a new
        route. Raises `ModelNowhere` when no host may serve the model."""
        if not self.several:
            return self.hosts[0]
        if not self.hosts_with(model):
            raise ModelNowhere(model, tuple(h.name for h in self.hosts))
        pin = self._pins.get(route) if route is not None else None
        if pin is None and route is not None and hint is not None:
            pin = self._hinted(route, model, hint)
        if pin is not None and route is not None:
            kept = self._kept(route, pin, model, fold)
            if kept is not None:
                return kept
        best = self._best(model)
        if best is None:  # every host that may serve it is down: it fails (or wakes) there
            if pin is not None and pin.host.may_serve(model):
                return pin.host
            fallback = self._best(model, up=False)
            assert fallback is not None  # hosts_with(model) is not empty
            return fallback
        if route is not None:
            if pin is not None and not pin.host.up:  # its host is down: displaced
                home = pin.home or pin.host
                self._pin(route, _Pin(best, None if home is best else home, fold))
                log.info("%s: %s is down; served by %s", route, pin.host.name, best.name)
            else:
                self._pin(route, _Pin(best))
        return best

    def fail_over(self, route: str | None, model: str, failed: Host, error: str, *,
                  fold: int = 0) -> Host | None:
        """After `failed` failed a call of `route`: mark it down and pin the route to the next
        host up that may serve `model`, remembering its home; that host, or None when none is
        left (a pool of one: always)."""
        self.mark_down(failed, error)
        if not self.several:
            return None
        pin = self._pins.get(route) if route is not None else None
        if pin is not None and pin.host is not failed and pin.host.up \
                and pin.host.may_serve(model):
            return pin.host  # another call of the route moved it already
        to = self._best(model)
        if to is None:
            return None
        if route is not None:
            home = pin.home if pin is not None and pin.home is not None else failed
            self._pin(route, _Pin(to, None if home is to else home, fold))
        log.info("%s: %s failed (%s); moved to %s", route or "a call", failed.name, error,
                 to.name)
        return to

    def host_of(self, route: str) -> Host | None:
        """The host `route` is pinned to (a pool of one: its host); None when it has none."""
        if not self.several:
            return self.hosts[0]
        pin = self._pins.get(route)
        return pin.host if pin is not None else None

    def home_of(self, route: str) -> Host | None:
        """Where a displaced route goes back to once it folded; None when it is home."""
        pin = self._pins.get(route)
        return pin.home if pin is not None else None

    def routes_on(self, host: Host) -> list[str]:
        """The routes pinned to `host`, the most recently used last."""
        if not self.several:
            return []  # a pool of one pins nothing: every route is its host's
        return [route for route, pin in self._pins.items() if pin.host is host]

    def hosts_with(self, model: str) -> list[Host]:
        """The hosts that may serve `model` (up or not), in config order."""
        return [h for h in self.hosts if h.may_serve(model)]

    def first_up(self) -> Host:
        """The host a question without a route goes to: the first up by priority and config
        order, else the first."""
        ordered = sorted(self.hosts, key=lambda h: (-h.priority, h.index))
        return next((h for h in ordered if h.up), ordered[0])

    def named(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)

    def enter(self, route: str) -> None:
        """A route's work has begun (a turn, a fold): it counts as load on its host."""
        self._active[route] += 1

    def leave(self, route: str) -> None:
        self._active[route] -= 1
        if self._active[route] <= 0:
            del self._active[route]

    @contextlib.contextmanager
    def calling(self, host: Host, *, routed: bool) -> Iterator[None]:
        """Held while a call is at `host` (its `in_flight`)."""
        host.in_flight += 1
        host.unrouted += not routed
        try:
            yield
        finally:
            host.in_flight -= 1
            host.unrouted -= not routed

    def load(self, host: Host) -> int:
        """Routes under way pinned to `host`, and the calls at it without a route."""
        pinned = sum(1 for route in self._active if (p := self._pins.get(route)) and p.host is host)
        return pinned + host.unrouted

    def _best(self, model: str, *, up: bool = True) -> Host | None:
        candidates = [h for h in self.hosts if h.may_serve(model) and (h.up or not up)]
        return min(candidates, default=None, key=lambda h: (
            -h.priority, self.load(h) >= self.slots, not h.has_loaded(model), self.load(h),
            h.index))

    def _kept(self, route: str, pin: _Pin, model: str, fold: int) -> Host | None:
        """The pinned host while it is up, or home once the route folded since it moved."""
        home = pin.home
        if home is not None and home.up and fold != pin.fold and home.may_serve(model):
            log.info("%s: back on %s from %s (its prompt changed since it moved)", route,
                     home.name, pin.host.name)
            self._pin(route, _Pin(home))
            return home
        if pin.host.up and pin.host.may_serve(model):
            self._pins.move_to_end(route)
            return pin.host
        return None

    def _hinted(self, route: str, model: str, hint: str) -> _Pin | None:
        host = self.named(hint)
        if host is None or not host.up or not host.may_serve(model):
            return None
        pin = _Pin(host)
        self._pin(route, pin)
        return pin

    def _pin(self, route: str, pin: _Pin) -> None:
        self._pins[route] = pin
        self._pins.move_to_end(route)
        while len(self._pins) > PINS_KEPT:
            self._pins.popitem(last=False)

    # ---- state ----------------------------------------------------------------------------

    def mark_down(self, host: Host, error: str) -> None:
        host.error = error
        if host.up:
            host.up, host.down_since = False, self.clock()
            host.changed.set()
            if self.several:
                log.warning("Ollama at %s is down: %s", host.name, error)

    def mark_up(self, host: Host) -> None:
        if not host.up and self.several:
            log.info("Ollama at %s is up again", host.name)
        host.up, host.error, host.down_since = True, None, None

    def served(self, host: Host, model: str) -> None:
        """`host` answered a call to `model`: it is up, and the model is loaded there."""
        self.mark_up(host)
        host.loaded.setdefault(tagged(model), None)

    def listed(self, host: Host, models: Sequence[str]) -> None:
        """What `host`'s /api/tags said."""
        host.models = frozenset(tagged(m) for m in models)
        host.missing.clear()

    def lacks(self, host: Host, model: str) -> None:
        """`host` answered 404 for `model`: not routed there until its list says otherwise."""
        host.missing.add(tagged(model))

    # ---- health ---------------------------------------------------------------------------

    def start(self) -> None:
        """Begin the health check (a pool of several; again, or after `close`: nothing)."""
        if self.several and not self._watches and not self._closed:
            self._watches = [asyncio.create_task(self._watch(h), name=f"roost-ollama-{h.index}")
                             for h in self.hosts]

    async def close(self) -> None:
        """Stop the health check and close every host's client."""
        self._closed = True
        watches, self._watches = self._watches, []
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        for host in self.hosts:
            await host.client.close()

    async def check_all(self) -> None:
        """Check every host now (doctor, a model no host lists: its list may be older)."""
        await asyncio.gather(*(self.check(h) for h in self.hosts))

    async def check(self, host: Host) -> None:
        """Ask `host` which models it has and runs, and mark it up or down."""
        try:
            async with asyncio.timeout(self.check_timeout):
                listed = await host.client.list()
        except _CHECK_ERRORS as exc:
            self.mark_down(host, _described(exc))
            return
        came_back = not host.up
        self.listed(host, [m.model for m in listed.models if m.model])
        self.mark_up(host)
        host.checked_at = self.clock()
        try:
            async with asyncio.timeout(self.check_timeout):
                running = await host.client.ps()
            host.loaded = {tagged(m.model): m.size_vram for m in running.models if m.model}
        except _CHECK_ERRORS as exc:  # a proxy may not pass /api/ps on
            log.debug("Ollama at %s: /api/ps not read (%s)", host.name, _described(exc))
        if came_back:
            host.version = None  # it may have been upgraded while it was down
        await self.version(host)

    async def version(self, host: Host) -> tuple[int, ...] | None:
        """`host`'s version from /api/version, asked until it answers; None when unknown."""
        if host.version is None:
            try:
                async with httpx.AsyncClient(base_url=host.url, timeout=VERSION_TIMEOUT,
                                             transport=capped_transport(CHECK_CAP)) as http:
                    response = await http.get("/api/version")
                    response.raise_for_status()
                    text = str(response.json().get("version", ""))
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.info("Ollama's version at %s is unknown (%s)", host.name, exc)
                return None  # asked again next time: the server may be starting
            host.version, host.version_text = version_numbers(text), text or None
            log.info("Ollama's version at %s: %s", host.name, text or "not said")
        return host.version or None

    async def _watch(self, host: Host) -> None:
        while True:
            try:
                await self.check(host)
            except Exception:  # the boundary of a background job: the next check tries again
                log.exception("health check of Ollama at %s failed", host.name)
            await self._until_next_check(host)

    async def _until_next_check(self, host: Host) -> None:
        """`every` after the last check, `down_every` while the host is down (one that goes
        down meanwhile is checked that much after its last check)."""
        loop = asyncio.get_running_loop()
        checked = loop.time()
        while (wait := checked + (self.every if host.up else self.down_every)
               - loop.time()) > 0:
            host.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await host.changed.wait()


def _described(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__
