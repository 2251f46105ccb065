"""The model calls of one turn after the first: tools, continuations, the in-turn safety net.

* Tool calls (Ollama's native tools API) run through the registry; each call and its result are
  saved as messages. At most `model.max_calls` model calls per turn; the last one is asked to
  answer without tools.
* A tool call written as plain text is never shown. From a model whose card says it writes
  its calls so (`text_calls`) it is read and run like a native one, and one that cannot be
  read goes back to the model as a failed call saying what is wrong. Any other model is nudged
  once (at the end of the last message, not in a system message of its own); written out
  again, the call is run if it can be read, else the user gets a plain apology, not raw JSON.
* An answer cut off with `done_reason: "length"` is continued, a bounded number of times, unless
  the window is already full to within 512 tokens: then the turn ends with what it has and says so.
* Before each call, the in-turn safety net (`daemon/context/compact.py`) may shrink the
  in-memory messages and have the model write down the state of the task. That state call is
  not one of the turn's `max_calls` (it would eat the rounds the task needs); it can happen at
  most once per tool round, so the turn stays bounded.
* A call Ollama refuses as over the window (after tool results, or the safety net's own) is
  refitted once: the turn's ratio learnt from the size Ollama states, the messages shrunk to
  fit at it, sent again; refused again, the turn ends with a plain line (daemon.turn.runner).
  An answer to a prompt a server that ignores `truncate` cut silently is discarded the same
  way: the ratio raised to what the cut proves, the messages shrunk, sent once more.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from daemon.context.budget import (
    MESSAGE_OVERHEAD_TOKENS,
    SILENT_CUT_SHARE,
    Estimator,
    calibrated_ratio,
    estimate_tokens,
    overflow_ratio,
    recalibrate,
)
from daemon.context.compact import (
    STATE_REQUEST,
    continue_from,
    request_tokens,
    should_compact,
    shrink,
    state_messages,
)
from daemon.context.echoes import without_framing
from daemon.context.replay import ChatMessage, shown_result
from daemon.context.text_calls import looks_like_text_tool_call, read_text_calls
from daemon.core.errors import AttachmentError, ContextOverflow, PromptCut
from daemon.llm.client import ChatResult
from daemon.store.attachments import StoredImage, read_image_base64, store_image
from daemon.store.event_log import Records
from daemon.tools.builtin import ToolContext
from daemon.tools.registry import Registry, Tool, ToolCall, ToolResult

MAX_CONTINUATIONS = 3
TOOL_RESULT_SHARE = 6  # one tool result may take a sixth of the budget in memory
CONTEXT_FULL_MARGIN = 512
TEXT_CALL_NUDGE = (
    "\n\n[Note: to use a tool, call it through the tool-calling interface; never write the call "
    "as JSON in your reply. If you need no tool, answer in plain words.]"
)
LAST_CALL_NUDGE = "\n\n[Note: this is your last step. Answer the user now with what you have.]"
NO_STATE = "(No state was written. Work out what is left from the messages above.)"
CONTINUE = "Continue exactly where your last message stopped. Do not repeat anything."
TEXT_CALL_APOLOGY = ("I tried to use one of my tools but did not manage to. Could you ask again, "
                     "perhaps in other words?")
CONTEXT_FULL_NOTE = ("\n\n[The answer stops here: this conversation fills the model's context "
                     "window. Send /compact or /new and ask for the rest.]")
CUT_OFF_NOTE = "\n\n[The answer was cut off; ask me to go on.]"
# Why an image a tool returned was refused (AttachmentError.reason), told to the model.
TOOL_IMAGE_PROBLEMS = {"damaged": "it is damaged (it cannot be decoded)",
                       "unsupported": "it is in a format roost cannot read",
                       "too_large": "it is larger than roost accepts",
                       "too_many_pixels": "it has more pixels than roost accepts"}
# Shown to the user (status while it runs, a line above the reply), never stored as the model's.
SAFETY_NET_LINE = "long turn: I condensed earlier tool results"

Call = Callable[[list[ChatMessage], list[dict[str, Any]] | None], Awaitable[ChatResult]]
Save = Callable[..., Awaitable[int]]  # save(role, content, **fields) -> the message's seq
# approve(tool, arguments) -> None to run it, else the result the model gets instead
# (daemon.turn.approvals); None for the whole loop: nobody can be asked, so nothing that
# needs a yes runs.
Approve = Callable[[Tool, Mapping[str, Any]], Awaitable[str | None]]
UNREADABLE_CALL = ("ERROR: your tool call could not be read: {problem}. Write it as one JSON "
                   'object, {{"name": "<tool>", "arguments": {{...}}}}, with one of these tools: '
                   "{tools}.")
NOBODY_TO_ASK = "ERROR: {name} needs the user's approval, which cannot be asked here."


@dataclass(frozen=True)
class LoopResult:
    """The turn's answer: `text` is the model's words (stored and replayed), `note` roost's own
    line under them for the user only (cut off, window full): stored inside the assistant
    message, it was replayed on every later turn and copied by a small model (issue 43)."""

    text: str
    calls: int
    tool_calls: int
    note: str = ""


def could_become_text_tool_call(text: str) -> bool:
    """While streaming: hold the text back, it may still turn out to be a written tool call."""
    stripped = text.lstrip()
    return not stripped or stripped.startswith(("{", "[", "```", "<tool", "<|tool", "<function"))


@dataclass(frozen=True)
class LoopParts:
    """What one turn's loop works with. `call` is the turn's model call and `save` the journal's
    save of a tool call or result (returning its seq); `status` shows the channel's progress
    line while a tool runs; `approve` asks the user for a tool that needs a yes (None: nobody
    can be asked). `vision`: the model sees the images a tool returns (stored under
    `attachments`); otherwise it gets a note that it cannot. `whole` says whether the server's
    prompt counts include cached tokens (`ModelClient.counts_whole_prompt`); without it only a
    count that fills num_ctx is taken for a cut. `cuts` says whether the server may cut
    silently at all (`ModelClient.cuts_silently`: one older than `truncate`); told it may
    not, only a count that fills most of num_ctx can prove a cut."""

    registry: Registry
    context: ToolContext
    records: Records
    call: Call
    save: Save
    clock: Callable[[], float]
    status: Callable[[str], None] | None = None
    approve: Approve | None = None
    vision: bool = False
    attachments: Path | None = None
    whole: Callable[[], Awaitable[bool]] | None = None
    cuts: Callable[[], Awaitable[bool]] | None = None
    retract: Callable[[], None] | None = None  # the stream forgets a dropped answer's words
    text_calls: bool = False  # the model writes tool calls as text (its card): read and run


class ToolLoop:
    """Runs the rest of a turn after its first model call; see the module docstring."""

    def __init__(self, parts: LoopParts, *, max_calls: int, budget: int, num_ctx: int,
                 ratio: float, estimate: Estimator = estimate_tokens) -> None:
        """`budget`, `num_ctx` and `ratio` are the first request's; the ratio is raised as
        Ollama's counts come in. `estimate` is the model's vocabulary's."""
        self.parts = parts
        self.max_calls = max_calls
        self.budget = budget
        self.num_ctx = num_ctx
        self.ratio = ratio
        self.estimate = estimate
        self.prompt_tokens = 0  # Ollama's prompt_eval_count, summed over the turn's calls
        self.safety_net = 0  # passes of the safety net this turn
        self.snapshots = 0  # requests after the first one kept in debug/

    def _tokens(self, messages: Sequence[ChatMessage], ratio: float) -> int:
        return request_tokens(messages, ratio, self.estimate)

    def tool_names(self) -> list[str]:
        return [t.name for c in self.parts.registry.capabilities.values() for t in c.tools]

    async def run(self, messages: list[ChatMessage], first: ChatResult) -> LoopResult:
        result, calls, tools_run = first, 1, 0
        self.prompt_tokens = first.prompt_eval_count or 0
        if first.prompt_eval_count:
            self._learn(first, messages, self._schemas())
        pieces: list[str] = []
        nudged = False
        continuations = 0
        while True:
            if result.tool_calls and calls < self.max_calls:
                tools_run += await self._run_tools(messages, result)
                messages = await self._maybe_compact(messages, result)
                last = calls + 1 >= self.max_calls
                if last:
                    messages = _with_note(messages, LAST_CALL_NUDGE)
                result = await self._call(messages, None if last else self._schemas())
                calls += 1
                continue
            text = result.content
            written = not result.tool_calls and looks_like_text_tool_call(text, self.tool_names())
            if written and (self.parts.text_calls or nudged):
                read = read_text_calls(text, self.tool_names())
                if read.calls:  # run like Ollama's own calls, the JSON never shown
                    await self._record("text-tool-call", f"{len(read.calls)} tool calls read "
                                       "from the model's text")
                    result = replace(result, content="", tool_calls=read.calls)
                    continue
                if self.parts.text_calls and calls < self.max_calls:
                    await self._unreadable(messages, text, read.problem)
                    result = await self._call(messages, self._schemas())
                    calls += 1
                    continue
            if result.tool_calls or written:
                if nudged or calls >= self.max_calls:
                    return LoopResult("".join(pieces) or TEXT_CALL_APOLOGY, calls, tools_run)
                nudged = True
                messages = _with_note(messages, TEXT_CALL_NUDGE)
                result = await self._call(messages, self._schemas())
                calls += 1
                continue
            # Each piece without roost's labels a small model copied at its end: joined first,
            # a label ending a cut-off piece stood in the middle of the reply.
            pieces.append(_unframed(text))
            if result.done_reason != "length":
                return LoopResult("".join(pieces), calls, tools_run)
            used = (result.prompt_eval_count or 0) + (result.eval_count or 0)
            if used >= self.num_ctx - CONTEXT_FULL_MARGIN:
                await self._record("context-full", f"answer stopped at {used} of {self.num_ctx} "
                             "tokens; ended the turn instead of continuing")
                return LoopResult("".join(pieces), calls, tools_run, CONTEXT_FULL_NOTE)
            if continuations >= MAX_CONTINUATIONS or calls >= self.max_calls:
                return LoopResult("".join(pieces), calls, tools_run, CUT_OFF_NOTE)
            continuations += 1
            await self._record("continuation", f"answer cut off at {result.eval_count} tokens; "
                         f"asked to continue ({continuations} of {MAX_CONTINUATIONS})")
            messages = [*messages, {"role": "assistant", "content": text},
                        {"role": "user", "content": CONTINUE}]
            result = await self._call(messages, self._schemas())
            calls += 1

    async def _call(
        self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None
    ) -> ChatResult:
        """One model call; Ollama's count of the prompt keeps the turn's ratio honest (only
        ever raised here: the turn's own calibration happens once it is saved). Refused as
        over the window, `messages` are refitted in place (the caller goes on with them) and
        sent once more; a second refusal is raised."""
        try:
            result = await self.parts.call(messages, tools)
        except ContextOverflow as exc:
            await self._refit(messages, tools, exc)
            result = await self.parts.call(messages, tools)
        if await self._cut(result, messages, tools):
            # The model saw part of the prompt: its answer (and any tool call) is dropped.
            if self.parts.retract is not None:
                self.parts.retract()
            result = await self.parts.call(messages, tools)
            if await self._cut(result, messages, tools):
                raise PromptCut(result.prompt_eval_count or 0, self.num_ctx, self.ratio)
        self.prompt_tokens += result.prompt_eval_count or 0
        if result.prompt_eval_count:
            self._learn(result, messages, tools)
        await self._snapshot(messages, tools, result)
        return result

    async def _refit(self, messages: list[ChatMessage], tools: list[dict[str, Any]] | None,
                     exc: ContextOverflow) -> None:
        """Learn the ratio from the size Ollama states (`overflow_ratio`), and shrink
        `messages` in place to fit the budget at that ratio."""
        schemas = (estimate_tokens(json.dumps(tools, separators=(",", ":")), 1.0)
                   if tools else 0)
        raw = self._tokens(messages, 1.0) + schemas
        before = self.ratio
        stated = exc.prompt_tokens
        self.ratio = overflow_ratio(before, stated=stated, raw=raw, overhead=_overhead(messages),
                                    num_ctx=self.num_ctx)
        # The budget was set with the schemas at the old ratio; they cost more at the new one.
        budget = self.budget - math.ceil(schemas * (self.ratio - before))
        messages[:] = shrink(messages, self.ratio, budget, self.estimate).messages
        await self._record("overflow-retry", (
            f"Ollama refused {stated} tokens (num_ctx {exc.context_size}) after "
            f"{len(messages)} messages; ratio {before:.2f} -> {self.ratio:.2f}, shrunk to "
            f"{self._tokens(messages, self.ratio)} estimated tokens, retried once"))

    async def _cut(self, result: ChatResult, messages: list[ChatMessage],
                   tools: list[dict[str, Any]] | None) -> bool:
        """Whether Ollama's count proves it cut this prompt (`recalibrate`); if so the turn's
        ratio is raised to what the cut proves and `messages` shrunk in place to fit at it."""
        count = result.prompt_eval_count
        if not count:
            return False
        schemas = _schema_tokens(tools, result)
        raw = self._tokens(messages, 1.0) + schemas
        estimate = self._tokens(messages, self.ratio) + math.ceil(schemas * self.ratio)
        whole = result.prompt_eval_cached_count is not None
        may_cut = True
        if count < SILENT_CUT_SHARE * estimate:  # asked only when the count could mark a cut
            if not whole and self.parts.whole is not None:
                whole = await self.parts.whole()
            if self.parts.cuts is not None:
                may_cut = await self.parts.cuts()
        before = self.ratio
        ratio, cut = recalibrate(before, count=count, raw=raw, overhead=_overhead(messages),
                                 estimate=estimate, num_ctx=self.num_ctx, whole=whole,
                                 may_cut=may_cut)
        if not cut:
            return False
        self.ratio = ratio
        budget = self.budget - math.ceil(schemas * (ratio - before))
        messages[:] = shrink(messages, ratio, budget, self.estimate).messages
        await self._record("silent-cut", (
            f"Ollama evaluated {count} tokens of about {estimate} sent (num_ctx "
            f"{self.num_ctx}); answer discarded, ratio {before:.2f} -> {ratio:.2f}, shrunk "
            f"to {self._tokens(messages, ratio)} estimated tokens, sent once more"))
        return True

    async def _snapshot(self, messages: Sequence[ChatMessage],
                        tools: list[dict[str, Any]] | None, result: ChatResult) -> None:
        """Every request of a turn goes to `debug/` (the runner keeps the first): what the
        model was sent, its estimate against the budget, and what Ollama counted."""
        self.snapshots += 1
        state = bool(messages) and messages[-1].get("content") == STATE_REQUEST
        await asyncio.to_thread(self.parts.records.snapshot, self.parts.clock(),
                                self.parts.context.conversation_id, {
            "call": self.snapshots + 1, "kind": "safety-net state" if state else "turn",
            "num_ctx": self.num_ctx, "budget": self.budget, "ratio": round(self.ratio, 4),
            "estimate": self._tokens(messages, self.ratio),
            "tool_schemas": len(tools or []), "prompt_eval_count": result.prompt_eval_count,
            "messages": [_without_pixels(m) for m in messages]})

    def _learn(self, result: ChatResult, messages: Sequence[ChatMessage],
               tools: list[dict[str, Any]] | None) -> None:
        """Raise the turn's ratio to what Ollama counted for this request (tools included)."""
        assert result.prompt_eval_count
        raw = self._tokens(messages, 1.0) + _schema_tokens(tools, result)
        measured = calibrated_ratio(result.prompt_eval_count, raw, _overhead(messages))
        self.ratio = max(self.ratio, measured)

    def _schemas(self) -> list[dict[str, Any]]:
        return self.parts.registry.schemas(self.parts.context.active)

    async def _run_tools(self, messages: list[ChatMessage], result: ChatResult) -> int:
        calls = [dict(c) for c in result.tool_calls]
        await self.parts.save("assistant", result.content, tool_calls=tuple(calls))
        messages.append({"role": "assistant", "content": result.content,
                         "tool_calls": calls})  # type: ignore[dict-item]
        for raw in calls:
            call = ToolCall.from_ollama(raw)
            if self.parts.status is not None:
                self.parts.status(self.parts.registry.progress_line(call.name))
            refused = await self._approval(call)
            outcome = (ToolResult(call.name, refused, error=True) if refused is not None
                       else await self.parts.registry.run(call, self.parts.context,
                                                          self.parts.context.active))
            # The model sees at most a sixth of the budget of one result, so the three newest
            # (which compaction never cuts) fit in half of it. The store keeps all of it, and
            # remembers the cap so that replay shows the same bytes on later turns.
            cap = int(self.budget / TOOL_RESULT_SHARE * 4 / self.ratio)
            shown = len(outcome.content) > cap
            meta = {**({"error": True} if outcome.error else {}),
                    **({"shown_chars": cap} if shown else {})}
            stored, note = await self._images(outcome)
            seq = await self.parts.save("tool", outcome.content + note, tool_name=call.name,
                                        meta=meta, attachments=tuple(s.to_doc() for s in stored))
            content = (shown_result(self.parts.context.conversation_id, seq, outcome.content, cap)
                       if shown else outcome.content) + note
            message: ChatMessage = {"role": "tool", "content": content, "tool_name": call.name}
            if stored and self.parts.vision and self.parts.attachments is not None:
                message["images"] = [  # type: ignore[typeddict-unknown-key]
                    await asyncio.to_thread(read_image_base64, s.to_doc(), self.parts.attachments)
                    for s in stored]
            messages.append(message)
        return len(calls)

    async def _unreadable(self, messages: list[ChatMessage], text: str, problem: str) -> None:
        """A tool call the model wrote as text that cannot be run: it goes back as a failed
        call with what is wrong, which the model can fix on its next step (the user never sees
        the JSON). Saved like any call, so the next turn's replay shows the same."""
        names = self.tool_names()
        named = next((n for n in names if f'"{n}"' in text or f"={n}>" in text), "tool_call")
        call: dict[str, Any] = {"function": {"name": named, "arguments": {}}}
        await self.parts.save("assistant", "", tool_calls=(call,))
        messages.append({"role": "assistant", "content": "",
                         "tool_calls": [call]})  # type: ignore[dict-item]
        error = UNREADABLE_CALL.format(problem=problem, tools=", ".join(names))
        await self.parts.save("tool", error, tool_name=named, meta={"error": True})
        messages.append({"role": "tool", "content": error, "tool_name": named})
        await self._record("text-tool-call", f"unreadable tool call sent back: {problem}")

    async def _images(self, outcome: ToolResult) -> tuple[list[StoredImage], str]:
        """A tool's images, checked and stored like a user's (Pillow, downscaled); and the
        note the model gets when it cannot see them or one was refused."""
        if not outcome.images or self.parts.attachments is None:
            return [], ""
        stored: list[StoredImage] = []
        notes: list[str] = []
        for data in outcome.images:
            try:
                stored.append(await asyncio.to_thread(store_image, data, self.parts.attachments))
            except AttachmentError as exc:
                # Its message speaks to a user who sent a photo ("send it again"): here the
                # tool made the image, and the model must not ask the user for it.
                problem = TOOL_IMAGE_PROBLEMS.get(exc.reason, "roost could not use it")
                notes.append(f"[the image {outcome.name} returned could not be used: {problem}; "
                             "that is a problem of the tool, not of anything the user sent]")
        if stored and not self.parts.vision:
            notes.append("[this model cannot see images, so the image is not shown]")
        return stored, "".join(f"\n{n}" for n in notes)

    async def _approval(self, call: ToolCall) -> str | None:
        """None when the call may run (or fails on its own: an unknown tool, bad arguments,
        which nobody need approve); else the result that stands in for it."""
        tool = self.parts.registry.tool(call.name, self.parts.context.active)
        if (tool is None or (tool.approve == "never" and not tool.shared)
                or tool.check(call.arguments)[1]):
            return None
        if self.parts.approve is None:
            return NOBODY_TO_ASK.format(name=tool.name)
        return await self.parts.approve(tool, tool.check(call.arguments)[0])

    async def _maybe_compact(
        self, messages: list[ChatMessage], last: ChatResult
    ) -> list[ChatMessage]:
        """The messages, shrunk and carrying a written state when they grew too large."""
        schemas = self._schemas()
        # The budget is the messages' (the schemas are taken off it already), while Ollama's
        # count covers the schemas too: compared as it is, a pass that reached half the budget
        # would look a schema's worth fuller and fire again a round later.
        fixed = estimate_tokens(json.dumps(schemas, separators=(",", ":")), self.ratio)
        measured = max(0, last.prompt_eval_count - fixed) if last.prompt_eval_count else None
        if not should_compact(self._tokens(messages, self.ratio), measured, self.budget):
            return messages
        started = time.monotonic()
        if self.parts.status is not None:
            self.parts.status(SAFETY_NET_LINE)
        shrunk = shrink(messages, self.ratio, self.budget, self.estimate)
        # The same tool schemas as every other call of the turn: changing them would make
        # Ollama re-read the whole prompt twice. The state is asked for in words, not tools.
        state = await self._call(state_messages(shrunk.messages), schemas)
        written = state.content.strip() or NO_STATE
        compacted = continue_from(shrunk.messages, written)
        await self._record("compaction", (
            f"{shrunk.targets} targets cut, {shrunk.images_dropped} images dropped; "
            f"{shrunk.tokens_before} -> {self._tokens(compacted, self.ratio)} estimated "
            f"tokens (budget {self.budget}); state written in "
            f"{time.monotonic() - started:.1f}s"))
        self.safety_net += 1
        return compacted

    async def _record(self, kind: str, detail: str) -> None:
        await asyncio.to_thread(self.parts.records.event, self.parts.clock(), kind,
                                self.parts.context.conversation_id, detail)


def _unframed(piece: str) -> str:
    """`piece` without the labels copied at its end (`without_framing`), its own spacing kept
    where there were none, so that the pieces of a continued answer join as they were
    written."""
    kept = without_framing(piece)
    return piece if kept == piece.rstrip() else kept


def _schema_tokens(tools: list[dict[str, Any]] | None, result: ChatResult) -> int:
    """The estimate at ratio 1 of the tool schemas that went with the request: none when the
    model takes no tools (the client sent none, whatever the loop offered)."""
    if not tools or not result.sent_tools:
        return 0
    return estimate_tokens(json.dumps(tools, separators=(",", ":")), 1.0)


def _overhead(messages: Sequence[ChatMessage]) -> int:
    return MESSAGE_OVERHEAD_TOKENS * len(messages)


def _without_pixels(message: ChatMessage) -> dict[str, Any]:
    """A message for the snapshot: its images as a count, not megabytes of base64."""
    out: dict[str, Any] = dict(message)
    if isinstance(out.get("images"), list):
        out["images"] = f"{len(out['images'])} image(s)"
    return out


def _with_note(messages: Sequence[ChatMessage], note: str) -> list[ChatMessage]:
    """Nudges ride at the end of the last message, where small models heed them."""
    out = [dict(m) for m in messages]
    last: Mapping[str, Any] = out[-1]
    out[-1] = {**last, "content": f"{last.get('content') or ''}{note}"}
    return out
