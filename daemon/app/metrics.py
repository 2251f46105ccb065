"""`GET /metrics`: what roost did and what waits, in Prometheus' text format.

Counters are bumped where things happen (the channel and intake wrappers in `daemon.app`, the
model client's observer, the HTTP guard); gauges (queues, outbox, health) are read at scrape
time and handed over in `Metrics.gauges`. Each application has its own registry, so two daemons
in one test process never mix. No label carries a chat id, a user or a host: /metrics is as
private as /healthz.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from daemon.llm.client import ChatResult

Gauges = Callable[[], Mapping[str, float]]


class Metrics:
    """The registry and the counters roost keeps."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.inbound = Counter("roost_inbound_messages", "Messages received, by outcome",
                               ["channel", "outcome"], registry=r)
        self.outbound = Counter("roost_outbound_messages", "Replies and notices sent, by outcome",
                                ["channel", "outcome"], registry=r)
        self.turn_seconds = Histogram(
            "roost_turn_seconds", "Time from a turn's start to its reply",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300), registry=r)
        self.prompt_tokens = Counter("roost_prompt_tokens", "Prompt tokens Ollama evaluated",
                                     ["kind"], registry=r)
        self.eval_tokens = Counter("roost_eval_tokens", "Tokens Ollama generated", ["kind"],
                                   registry=r)
        self.uncached_tokens = Counter(
            "roost_uncached_prompt_tokens",
            "Prompt tokens after the prefix shared with the previous request (estimated)",
            registry=r)
        self.model_calls = Counter("roost_model_calls", "Model calls, by kind (turn or fold)",
                                   ["kind"], registry=r)
        self.events = Counter("roost_events",
                              "Events of the event log by kind: fold, compaction, rotation, "
                              "overflow-retry, silent-cut, undeliverable, whatsapp-template "
                              "(a template sent to reopen a chat, or refused)", ["kind"],
                              registry=r)
        self.parts_resent = Counter(
            "roost_parts_resent",
            "Reply parts sent again after a restart: in flight when an earlier process died "
            "(sent, the platform's answer not recorded), so the chat may have them twice",
            ["channel"], registry=r)
        self.webhook_rejections = Counter("roost_webhook_rejections",
                                          "Webhook calls refused, by cause", ["cause"], registry=r)
        self.automation_runs = Counter(
            "roost_automation_runs",
            "Automation runs recorded, by automation and outcome (ok, undelivered, quiet, failed, "
            "skipped, missed)", ["automation", "outcome"], registry=r)
        self.transcriptions = Counter(
            "roost_transcriptions",
            "Voice notes and audio files, by outcome (heard, off, too_long, unreadable, "
            "unavailable, failed)", ["outcome"], registry=r)
        self.transcription_seconds = Histogram(
            "roost_transcription_seconds",
            "Time the transcription backend took for one recording (queueing for the model's "
            "slot not included)", buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120), registry=r)
        self._previous = ""
        # Gauges are read at each scrape by the route (on the event loop): name -> value.
        self.gauges: dict[str, float] = {}
        self.registry.register(_GaugeCollector(lambda: self.gauges))

    def model_call(self, messages: Sequence[Mapping[str, Any]], result: ChatResult,
                   background: bool) -> None:
        """The model client's observer: tokens, and how much of the prompt Ollama had cached."""
        kind = "fold" if background else "turn"
        self.model_calls.labels(kind).inc()
        prompt = result.prompt_eval_count or 0
        self.prompt_tokens.labels(kind).inc(prompt)
        self.eval_tokens.labels(kind).inc(result.eval_count or 0)
        text = json.dumps(list(messages), ensure_ascii=False, sort_keys=True, default=str)
        shared = common_prefix(text, self._previous)
        self._previous = text
        # Ollama reuses its cache for the longest shared prefix; scaled from characters.
        self.uncached_tokens.inc(round(prompt * (1 - shared / len(text))) if text else prompt)

    def transcription(self, outcome: str, seconds: float | None) -> None:
        """The voice step's observer (daemon.voice.hearing): one recording, and what it took."""
        self.transcriptions.labels(outcome).inc()
        if seconds is not None:
            self.transcription_seconds.observe(seconds)

    def turn_done(self, seconds: float) -> None:
        self.turn_seconds.observe(seconds)

    def automations_known(self, names: Iterable[str], outcomes: Iterable[str]) -> None:
        """Start each configured automation's series at 0, so that the first run shows as a
        change (a rate or an alert on failures sees it) rather than as a new series."""
        for name in names:
            for outcome in outcomes:
                self.automation_runs.labels(name, outcome)

    def automation_run(self, name: str, outcome: str) -> None:
        self.automation_runs.labels(name, outcome).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _GaugeCollector(Collector):
    def __init__(self, read: Gauges) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        for name, value in self.read().items():
            yield GaugeMetricFamily(name, _HELP.get(name, name), value=value)

    def describe(self) -> Iterator[Metric]:
        return iter(())


_HELP = {
    "roost_queued_messages": "Messages received and not yet answered, all chats",
    "roost_busy_chats": "Chats with messages waiting or a turn running",
    "roost_outbox_pending": "Replies and notices saved and not yet delivered",
    "roost_undeliverable_chats": "Chats marked undeliverable now (the user blocked the bot); "
                                 "cleared when the user writes again",
    "roost_model_requests_in_flight": "Requests at Ollama now",
    "roost_healthy": "1 when /healthz says ok, else 0",
    "roost_start_time_seconds": "When this process started (Unix time)",
}


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search: slices compare in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


START_TIME = time.time()
