"""`GET /metrics`: what roost did and what waits, in Prometheus' text format.

Counters are bumped where things happen (the channel and intake wrappers in `daemon.app`, the
model client's observer, the HTTP guard); gauges (queues, outbox, health) are read at scrape
time and handed over in `Metrics.gauges` (and `Metrics.per_host.now`, each Ollama host's). Each
application has its own registry, so two daemons in one test process never mix. No label carries
a chat id or a user. With several Ollama hosts (`[model] hosts`) the model's series per host
(its requests, errors, latency, whether it is up, its requests now) name it by its URL with any
credentials taken out, as the log does; one host alone is named nowhere: /metrics is then as
private as /healthz.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from daemon.llm.client import ChatResult

Gauges = Callable[[], Mapping[str, float]]
# Seconds one model call may take, streaming included: a short answer to a long reply.
CALL_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class HostGauges(NamedTuple):
    """One Ollama host as a scrape finds it."""

    up: bool
    in_flight: int


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
        self.per_host = HostSeries(r)
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
        # The last request sent to each host: its cache holds that prefix, no other's.
        self._previous: dict[str, str] = {}
        # Gauges are read at each scrape by the route (on the event loop): name -> value.
        self.gauges: dict[str, float] = {}
        self.registry.register(_GaugeCollector(lambda: self.gauges))

    def model_call(self, messages: Sequence[Mapping[str, Any]], result: ChatResult,
                   background: bool, seconds: float | None = None) -> None:
        """The model client's observer: tokens, how much of the prompt Ollama had cached, and
        the call at its host (`result.host`), with the `seconds` it took when told."""
        kind = "fold" if background else "turn"
        self.model_calls.labels(kind).inc()
        self.per_host.answered(result.host, seconds)
        prompt = result.prompt_eval_count or 0
        self.prompt_tokens.labels(kind).inc(prompt)
        self.eval_tokens.labels(kind).inc(result.eval_count or 0)
        text = json.dumps(list(messages), ensure_ascii=False, sort_keys=True, default=str)
        shared = common_prefix(text, self._previous.get(result.host, ""))
        self._previous[result.host] = text
        # Ollama reuses its cache for the longest shared prefix; scaled from characters.
        self.uncached_tokens.inc(round(prompt * (1 - shared / len(text))) if text else prompt)

    def model_failed(self, host: str, seconds: float | None = None) -> None:
        """The model client's observer: a call `host` failed, after `seconds` when told."""
        self.per_host.failed(host, seconds)

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


class HostSeries(Collector):
    """The model's series per Ollama host, of a pool of several (`hosts_known`): calls answered
    and failed and their time, counted as they happen; up and requests now, as a scrape finds
    them (`now`). Until told the hosts, it counts nothing (one host is named nowhere)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "roost_model_host_requests", "Model calls an Ollama host answered, by host",
            ["host"], registry=registry)
        self.errors = Counter(
            "roost_model_host_errors",
            "Model calls an Ollama host failed (refused, an error status, silence), by host; "
            "the call went on at another host when one was up", ["host"], registry=registry)
        self.seconds = Histogram(
            "roost_model_host_seconds",
            "Time one model call took at its Ollama host, its answer streamed, by host",
            ["host"], buckets=CALL_BUCKETS, registry=registry)
        self.names: frozenset[str] = frozenset()
        self.now: dict[str, HostGauges] = {}  # set by the route at each scrape
        registry.register(self)

    def hosts_known(self, names: Iterable[str]) -> None:
        """Count for these hosts, each series started at 0 (its first error shows as a
        change)."""
        self.names = frozenset(names)
        for name in self.names:
            self.requests.labels(name)
            self.errors.labels(name)

    def answered(self, host: str, seconds: float | None) -> None:
        if host in self.names:
            self.requests.labels(host).inc()
            if seconds is not None:
                self.seconds.labels(host).observe(seconds)

    def failed(self, host: str, seconds: float | None) -> None:
        if host in self.names:
            self.errors.labels(host).inc()
            if seconds is not None:
                self.seconds.labels(host).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        """The gauges (the counters collect themselves); the families are there without
        hosts too."""
        up = GaugeMetricFamily("roost_model_host_up", _HOST_HELP["roost_model_host_up"],
                               labels=["host"])
        busy = GaugeMetricFamily("roost_model_host_requests_in_flight",
                                 _HOST_HELP["roost_model_host_requests_in_flight"],
                                 labels=["host"])
        for name, host in self.now.items():
            up.add_metric([name], 1.0 if host.up else 0.0)
            busy.add_metric([name], host.in_flight)
        yield up
        yield busy

    def describe(self) -> Iterator[Metric]:
        return iter(())


_HOST_HELP = {
    "roost_model_host_up": "1 while the Ollama host answers (its health check, or its last "
                           "call), else 0; by host",
    "roost_model_host_requests_in_flight": "Requests at the Ollama host now, by host",
}
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
