"""The route a model call belongs to, and the host the pool gives it (daemon/llm/pool.py).

The route is a context variable, set around a route's work (`Routing.routing`: a conversation's
turn or fold, an automation's run), so that every call on the way (the tool rounds, the lookups
that fit the request, the version questions) goes to the route's host without its key being
passed down, as the gate's `scheduled` does for priority.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from daemon.core.errors import LLMError, LLMTimeout, LLMUnavailable, ModelCrashed, ModelNowhere
from daemon.llm.pool import Host, HostPool, Route

# What a host failed with when it is out rather than the request wrong: the host is marked down,
# and a route there moves on.
OUTAGES = (LLMUnavailable, LLMTimeout, ModelCrashed)

_route: contextvars.ContextVar[Route | None] = contextvars.ContextVar("roost_route",
                                                                     default=None)


class Routing:
    """Which host of `pool` the calls made now go to."""

    def __init__(self, pool: HostPool) -> None:
        self.pool = pool

    @contextlib.contextmanager
    def routing(self, route: str, fold: int = 0, hint: str | None = None) -> Iterator[None]:
        """Inside, calls go to `route`'s host; the route counts as load there meanwhile."""
        token = _route.set(Route(route, fold, hint))
        self.pool.enter(route)
        try:
            yield
        finally:
            self.pool.leave(route)
            _route.reset(token)

    @property
    def route(self) -> Route | None:
        """The route being served now, or None."""
        return _route.get()

    def host_of(self, route: str | None = None) -> Host | None:
        """The host `route` (by default the one served now) is pinned to, if any."""
        key = route if route is not None else getattr(_route.get(), "key", None)
        return self.pool.host_of(key) if key is not None else None

    async def host(self, model: str) -> Host:
        """The host for a call to `model` now (a new route is pinned there). A model no host
        lists is looked for again once their lists are fresh: it may have been pulled since."""
        self.pool.start()
        try:
            return self._host_for(model)
        except ModelNowhere:
            await self.pool.check_all()
            return self._host_for(model)

    def asked(self) -> Host:
        """The host a question about the server goes to: the route's, else the first up."""
        return self.host_of() or self.pool.first_up()

    def failed(self, host: Host, error: LLMError) -> LLMError:
        """`error` as `host` answered it, named so (`error.host`); an outage marks it down."""
        error.host = host.name
        if isinstance(error, OUTAGES):
            self.pool.mark_down(host, str(error))
        return error

    def fail_over(self, model: str, error: LLMError) -> Host | None:
        """After `error` from the host it names: that host marked down and the route served
        now pinned to the next host up that may serve `model`; None when none is left."""
        failed = self.pool.named(error.host) if error.host else None
        if failed is None:
            return None
        route = _route.get()
        return self.pool.fail_over(route.key if route else None, model, failed, str(error),
                                   fold=route.fold if route else 0)

    def _host_for(self, model: str) -> Host:
        route = _route.get()
        if route is None:
            return self.pool.host_for(None, model)
        return self.pool.host_for(route.key, model, fold=route.fold, hint=route.hint)
