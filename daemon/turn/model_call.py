"""The model calls of a turn: outage, refit and retry, calibration.

Every call of the turn goes through `ModelCall.call` (the tool loop's too); the first request
is built (`prepare`) and answered (`answer`) here, the rest of the turn in `ToolLoop`.

* A call whose host fails (a refused connection, a 502/503/504, a 500, silence) goes to the
  next host of the pool that has the model (`[model] hosts`, daemon/llm/pool.py) at once, within
  the turn: the reply's preview starts again, no attempt is counted and the user hears of no
  outage; the log says which host failed and which answered. With no other host (one host, or
  all out), a call is retried with backoff while Ollama is unreachable (500s: one is tried again
  at once, more are an outage; a 500 naming the request is reported), and the user is told once
  a turn (`Outage`). Building the first request asks `/api/show`, so it is retried the same
  way (the client itself asks the next host first).
* A request whose fixed part does not fit at the conversation's ratio is built again at a lower
  one (`_refit_lower`) rather than refused.
* An overflow rejection (before anything streamed) is refitted and sent again, at most twice:
  the turn's new messages as their handle first (what changed since the last request that
  fitted), then at the ratio the refusal proves; what it taught stays with the conversation
  (`Lessons`). An answer to a prompt Ollama cut silently (a server that ignores
  `truncate: false`) is discarded, and the request rebuilt at the ratio the cut proves and sent
  once more.
* The conversation's token ratio is calibrated from Ollama's `prompt_eval_count`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from daemon.context.budget import RATIO_MIN, overflow_ratio, recalibrate
from daemon.context.handles import as_handle
from daemon.context.replay import ChatMessage
from daemon.core.config import Settings
from daemon.core.conversations import Conversation, Message
from daemon.core.errors import (
    AttachmentError,
    ContextOverflow,
    DoesNotFit,
    LLMError,
    LLMTimeout,
    LLMUnavailable,
    ModelCrashed,
    PromptCut,
)
from daemon.core.logs import turn_log as log
from daemon.llm.client import ChatResult, ModelClient
from daemon.store import Store
from daemon.store.attachments import read_image_base64
from daemon.store.event_log import Records
from daemon.turn.prompting import Prepared, Prompting
from daemon.turn.reply_stream import ReplyStream

MAX_BACKOFF = 60.0
REFITS = 2  # an overflow refusal is refitted and sent again at most this often in the first call
# The ratio a conversation starts from (bytes/4). A request that does not fit at a higher ratio
# is built once more at this one rather than refused: the ratio may be what is wrong.
RATIO_START = 1.0

Notify = Callable[[str, str], Awaitable[None]]  # (chat_key, text) -> notice delivered
# The channel's "working" context for a chat (typing...), entered while a
# call of the chat's turn holds the model, so it shows only for the chat being answered.
Working = Callable[[str], AbstractAsyncContextManager[None]]


def not_shown(chat_key: str) -> AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()


class Outage:
    """The outage notice of one turn, said at most once: by whichever call first finds the
    model server unreachable, the model lookup before the request is built (the first thing
    to fail after a start with Ollama down) or a model call. With several hosts (`hosts`), it
    comes only once none is left, and names them all."""

    def __init__(self, notify: Notify, chat_key: str, host: str, announce: bool) -> None:
        self.notify = notify
        self.chat_key = chat_key
        self.host = host
        self.hosts: tuple[str, ...] = ()
        self.pending = announce

    async def tell(self, exc: LLMError) -> None:
        if self.pending:
            self.pending = False
            failing = isinstance(exc, ModelCrashed)
            if len(self.hosts) > 1:
                where = f"The model servers ({', '.join(self.hosts)})"
                state = "keep failing" if failing else "are not answering"
            else:
                where = f"The model server at {self.host}"
                state = "keeps failing" if failing else "is not answering"
            await self.notify(self.chat_key, (
                f"{where} {state}. Your message is saved; "
                "I will keep trying and answer when it is back."))


@dataclass
class Lessons:
    """What a turn's refusals taught about its conversation, kept with it whether the turn is
    answered or not (issue 43: a raised ratio dropped at the next turn was refused again):
    messages to replay as their handle, and the lowest ratio the refusals allow. It also
    counts what happened to the first request, for the console's request table."""

    handled: tuple[int, ...] = ()
    ratio: float | None = None
    refused: int = 0  # over-window refusals before a request fitted
    cut: int = 0  # answers discarded because Ollama cut the prompt silently

    def kept_by(self, conversation: Conversation) -> Conversation:
        """`conversation` with what was learnt: the handles, and for a turn that ended
        without an accepted request (no count to calibrate from) the ratio."""
        handled = tuple(dict.fromkeys((*conversation.handled, *self.handled)))
        ratio = max(conversation.token_ratio, self.ratio or 0.0)
        return replace(conversation, handled=handled, token_ratio=ratio)


@dataclass(frozen=True)
class Site:
    """Where one turn's calls come from and go: its chat, the model every call goes to, the
    stream that shows the reply, the turn's outage notice, what its refusals taught."""

    chat_key: str
    model: str
    stream: ReplyStream
    outage: Outage
    lessons: Lessons = field(default_factory=Lessons)


class ModelCall:
    """The model calls of a turn (see the module docstring); `notify` tells the user of an
    outage or of an image the model cannot see, `working` shows the channel's "typing"."""

    def __init__(self, *, settings: Settings, store: Store, llm: ModelClient,
                 prompting: Prompting, records: Records, notify: Notify,
                 clock: Callable[[], float], working: Working) -> None:
        self.settings = settings
        self.store = store
        self.llm = llm
        self.prompting = prompting
        self.records = records
        self.notify = notify
        self.clock = clock
        self.working = working

    async def answer(
        self, site: Site, conversation: Conversation, history: Sequence[Message],
        prepared: Prepared, new_images: bool,
    ) -> tuple[ChatResult, Prepared, list[ChatMessage]]:
        """The first model call, with exactly one refit and retry after an overflow rejection,
        and one after a silent cut; a second cut raises `PromptCut`."""
        result, prepared, messages = await self._first_call(
            site, conversation, history, prepared, new_images)
        ratio, cut = await self.calibrate(conversation, prepared, result)
        if not cut:
            return result, prepared, messages
        # The model saw only part of the prompt (often without its system message): its answer
        # is not delivered or stored, and none of its tool calls run. Built again at the ratio
        # the cut proves, the request is sent once more.
        site.lessons.cut += 1
        site.stream.retract()
        refit = await self.prompting.prepare(conversation, history, ratio=ratio,
                                             model=site.model)
        messages = await self._messages(site, refit, notify=False)
        result = await self.call(site, messages, [dict(t) for t in refit.tools] or None)
        again, cut = await self.calibrate(conversation, refit, result)
        if cut:
            raise PromptCut(result.prompt_eval_count or 0, refit.num_ctx, again)
        return result, refit, messages

    async def _first_call(
        self, site: Site, conversation: Conversation, history: Sequence[Message],
        prepared: Prepared, new_images: bool,
    ) -> tuple[ChatResult, Prepared, list[ChatMessage]]:
        """The first model call; refused as over the window, refitted and sent again, at most
        `REFITS` times (`_refit`: the newest messages as their handle first, then a higher
        ratio). A refusal costs no generation, and giving up tells the user their
        conversation does not fit, which the one before the paste did."""
        try:
            messages = await self._messages(site, prepared, notify=new_images)
            return await self.call(site, messages, _tools(prepared)), prepared, messages
        except ContextOverflow as exc:
            refused = exc
        for attempt in range(REFITS):
            refit = await self._refit(site, conversation, history, prepared, refused, attempt)
            messages = [dict(m) for m in refit.request.messages]
            if refit.request.images:  # already attached or noted on the first try
                messages = await self._messages(site, refit, notify=False)
            try:
                return await self.call(site, messages, _tools(refit)), refit, messages
            except ContextOverflow as exc:
                refused, prepared = exc, refit
        raise refused

    async def _refit(
        self, site: Site, conversation: Conversation, history: Sequence[Message],
        prepared: Prepared, exc: ContextOverflow, attempt: int,
    ) -> Prepared:
        """The request again after Ollama refused `prepared` as over the window. The newest
        content is what changed since the last request that fitted, so it shrinks first: the
        turn's new messages go as their handle (a line and where the rest is), at the same
        ratio unless Ollama said the size; after that the ratio rises to what the refusal
        proves. What is learnt (`site.lessons`) stays with the conversation, answered or not.
        At a ratio where the fixed part does not fit, a lower one is tried, down to the
        conversation's own, which fitted before: `DoesNotFit` becomes the refusal."""
        site.lessons.refused += 1
        fresh = [m.seq for m in _newest_user_messages(history)
                 if m.seq not in site.lessons.handled and as_handle(m) is not m]
        if fresh:
            site.lessons.handled = (*site.lessons.handled, *fresh)
        raw, overhead = prepared.raw_estimate(), prepared.overhead()
        if fresh and not exc.prompt_tokens and attempt == 0:
            ratio = prepared.ratio
        else:
            ratio = overflow_ratio(prepared.ratio, stated=exc.prompt_tokens, raw=raw,
                                   overhead=overhead, num_ctx=prepared.num_ctx)
        site.lessons.ratio = max(ratio, site.lessons.ratio or 0.0)
        lesson = replace(conversation, handled=site.lessons.handled)
        await asyncio.to_thread(
            self.records.event, self.clock(), "overflow-retry", conversation.id,
            f"Ollama refused {exc.prompt_tokens or 'more than'} {prepared.num_ctx} tokens "
            f"(estimated {prepared.request.estimate}); {len(fresh)} newest messages as their "
            f"handle, ratio {prepared.ratio:.2f} -> {ratio:.2f}, refitted and retried")
        for lower in (ratio, (ratio + conversation.token_ratio) / 2, conversation.token_ratio):
            try:
                return await self.prompting.prepare(lesson, history, ratio=lower,
                                                     model=site.model)
            except DoesNotFit:
                if lower <= conversation.token_ratio:
                    break
        raise exc

    async def call(
        self, site: Site, messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
    ) -> ChatResult:
        """Call the model; a host that fails it hands the call to the next host with the model
        at once (`_moved`). With none left, retry with backoff while it is unreachable (a
        refused connection, or a 502/503/504 from Ollama or a proxy); tell the user once. A 500
        (a runner that crashed) is tried once more at once; failing on, it is handled as
        unreachable."""
        model = self.settings.model
        crashed = False
        attempt = 0  # tries while Ollama is out; the quiet try after a 500 is not one of them
        failed: list[str] = []  # the hosts that failed this call, for the log
        while True:
            site.stream.begin()  # a try on another host starts the preview again
            try:
                result = await self.llm.chat(messages, model=site.model, tools=tools,
                                             on_delta=site.stream.delta,
                                             on_thinking=site.stream.thinking,
                                             while_held=lambda: site.stream.watching(
                                                 self.working(site.chat_key)))
            except (LLMUnavailable, LLMTimeout, ModelCrashed) as exc:
                if self._moved(site, exc, failed):
                    continue
                if isinstance(exc, LLMTimeout | LLMUnavailable):
                    await self._unreachable(attempt, exc, site.outage)
                    attempt += 1
                    continue
                if not crashed:  # one failure is often the runner's alone: again, quietly
                    crashed = True
                    log.warning("Ollama failed on a request for %s (%s); trying once more",
                                site.chat_key, exc)
                    await asyncio.sleep(model.retry_backoff)
                    continue
                await self._unreachable(attempt, exc, site.outage)  # raises at the last attempt
                attempt += 1
                continue
            if failed:
                log.warning("conversation %s: %s; answered by %s", self.llm.route or site.chat_key,
                            "; ".join(failed), result.host)
            site.stream.end(result, [t["function"]["name"] for t in tools or ()])
            return result

    def _moved(self, site: Site, exc: LLMError, failed: list[str]) -> bool:
        """Whether the call goes on at another host of the pool, the one that failed it
        (`exc.host`) marked down and the conversation pinned to the next with the model."""
        to = self.llm.fail_over(site.model, exc)
        if to is None:
            return False
        failed.append(f"{exc.host} failed ({exc})")
        log.info("%s: %s failed (%s); asking %s", site.chat_key, exc.host, exc, to)
        site.stream.retract("moved")  # what it wrote is not the answer: said in the reply
        return True

    async def prepare(
        self, site: Site, conversation: Conversation, history: Sequence[Message],
    ) -> Prepared:
        """The first request of the turn, retried like a model call while Ollama is
        unreachable: building it asks `/api/show`, which nothing has cached yet after a start."""
        attempt = 0
        failed: list[str] = []
        while True:
            try:
                try:
                    return await self.prompting.prepare(conversation, history,
                                                        model=site.model)
                except DoesNotFit as exc:
                    return await self._refit_lower(conversation, history, site.model, exc)
            except (LLMUnavailable, LLMTimeout, ModelCrashed) as exc:
                if self._moved(site, exc, failed):
                    continue
                await self._unreachable(attempt, exc, site.outage)  # raises at the last attempt
                attempt += 1

    async def _refit_lower(
        self, conversation: Conversation, history: Sequence[Message], model: str,
        exc: DoesNotFit,
    ) -> Prepared:
        """Only the prefix and summary were left, and they did not fit at the conversation's
        ratio: an overestimate must not lock the conversation. Build the request at the ratio
        where that part fits (it scales with the ratio), else at the starting one; Ollama's
        count of what is sent calibrates the ratio again. Raises `DoesNotFit` when even the
        starting ratio leaves no room: then the window is too small."""
        ratio = conversation.token_ratio
        fitting = max(ratio * exc.budget / exc.needed * 0.95, RATIO_MIN)
        tries = [r for r in (fitting, RATIO_START) if r < ratio]
        if not tries:
            raise exc
        for lower in sorted(set(tries), reverse=True):
            try:
                prepared = await self.prompting.prepare(conversation, history, model=model,
                                                        ratio=lower)
            except DoesNotFit as again:
                exc = again
                continue
            await asyncio.to_thread(
                self.records.event, self.clock(), "ratio-reset", conversation.id,
                f"the fixed part needed {exc.needed} of {exc.budget} tokens at ratio "
                f"{ratio:.2f}; built again at {lower:.2f}")
            log.warning("conversation %s: request did not fit at ratio %.2f; built at %.2f",
                        conversation.id, ratio, lower)
            return prepared
        raise exc

    async def _unreachable(self, attempt: int, exc: LLMError, outage: Outage) -> None:
        """After a failed try: log, tell the user (once a turn), re-raise after the last try,
        else wait the backoff."""
        model = self.settings.model
        log.warning("Ollama at %s unreachable (attempt %d of %d): %s",
                    exc.host or self.llm.host, attempt + 1, model.retry_attempts, exc)
        outage.hosts = tuple(h.name for h in self.llm.pool.hosts)
        await outage.tell(exc)
        if attempt + 1 == model.retry_attempts:
            raise exc
        await asyncio.sleep(min(model.retry_backoff * 2**attempt, MAX_BACKOFF))

    async def _messages(
        self, site: Site, prepared: Prepared, *, notify: bool = True
    ) -> list[ChatMessage]:
        """The request's messages with the newest image's pixels, if the model can see them."""
        messages = [dict(m) for m in prepared.request.messages]
        if not prepared.request.images:
            return messages
        info = await self.llm.model_info(site.model)
        attachments = self.store.state_dir / "attachments"
        for index, images in prepared.request.images.items():
            if "vision" in info.capabilities:
                try:
                    messages[index]["images"] = [  # type: ignore[assignment]
                        await asyncio.to_thread(read_image_base64, dict(i), attachments)
                        for i in images]
                    continue
                except AttachmentError as exc:
                    log.warning("image of %s unreadable: %s", site.chat_key, exc)
            messages[index] = {**messages[index], "content": (
                f"{messages[index].get('content') or ''}\n[an image was sent; this model cannot "
                "see images, so it is not shown]").lstrip()}
            if notify:
                await self.notify(site.chat_key, (
                    f"The model {info.name} cannot see images, so I only know that you sent "
                    "one. Describe it in words, or use a vision model."))
        return messages

    async def calibrate(
        self, conversation: Conversation, prepared: Prepared, result: ChatResult
    ) -> tuple[float, bool]:
        """The conversation's new token ratio from Ollama's count (`recalibrate`), and whether
        Ollama cut the prompt silently (recorded as an event). Whether the count includes the
        cached part, and whether the server could have cut at all, are asked of the server
        only when the reading would lower the ratio or mark a cut."""
        count = result.prompt_eval_count
        raw = prepared.raw_estimate()
        if not count or prepared.request.images or raw <= 0:
            return prepared.ratio, False
        estimate = prepared.request.estimate + prepared.tool_tokens
        low = count < estimate  # only then can the reading lower the ratio or mark a cut
        whole = (result.prompt_eval_cached_count is not None or not low
                 or await self.llm.counts_whole_prompt())
        may_cut = low and await self.llm.cuts_silently(prepared.model)
        ratio, cut = recalibrate(prepared.ratio, count=count, raw=raw,
                                 overhead=prepared.overhead(), estimate=estimate,
                                 num_ctx=prepared.num_ctx, whole=whole, may_cut=may_cut)
        if cut:
            await asyncio.to_thread(self.records.event, self.clock(), "silent-cut",
                                    conversation.id,
                                    f"Ollama evaluated {count} tokens of about {estimate} sent "
                                    f"(num_ctx {prepared.num_ctx}); ratio {prepared.ratio:.2f} "
                                    f"-> {ratio:.2f}")
            log.warning("conversation %s: Ollama cut the prompt silently (%d of ~%d tokens)",
                        conversation.id, count, estimate)
        return ratio, cut


def _tools(prepared: Prepared) -> list[dict[str, Any]] | None:
    return [dict(t) for t in prepared.tools] or None


def _newest_user_messages(history: Sequence[Message]) -> list[Message]:
    """The user messages after the last answer: the ones this turn answers."""
    newest: list[Message] = []
    for message in reversed(history):
        if message.role != "user":
            break
        newest.append(message)
    return newest[::-1]
