"""The one error hierarchy of roost.

    RoostError
    ├── ConfigError                 a bad config file or setting (exit status 78)
    ├── SetupStop                   (daemon.core.setup) a step of `roost init` cannot go on
    ├── StoreError                  the state directory cannot be read or written
    │   ├── NoState                 (daemon.store) no roost state there yet: a fresh install
    │   ├── CorruptFile             (daemon.store.files) a state file that does not parse
    │   └── FactError               (daemon.store.facts) a fact not kept or not found; for the user
    ├── McpError                    an MCP server is not running, or a call to it failed
    ├── AttachmentError             a photo or file refused; its message is for the user
    ├── VoiceError                  a recording not transcribed; its message is for the user
    ├── DocumentError               a PDF, DOCX, XLSX or page that cannot be read (bounded parse)
    ├── WebError                    web_fetch or web_search could not get an answer
    │   └── WebRefused              the address guard refused a URL (private, loopback, ...)
    ├── DoesNotFit                  also a ValueError: the protected messages exceed the budget
    ├── TooLarge                    (daemon.core.bodies) also a ValueError: an answer past its cap
    ├── Stopped                     the user stopped the reply being written (/stop, Ctrl-C)
    ├── LLMError                    anything the model server answered badly
    │   ├── LLMUnavailable          also a ConnectionError: Ollama cannot be reached
    │   ├── LLMTimeout              also a TimeoutError: Ollama stopped answering
    │   ├── ModelNotFound           the configured model is not pulled
    │   │   └── ModelNowhere        no Ollama host of the pool has it, or may serve it
    │   ├── ContextOverflow         Ollama refused a prompt larger than num_ctx
    │   │   └── PromptCut           Ollama cut a prompt silently, again after a refit
    │   ├── ModelCrashed            a 500: the server failed (retried, then an outage)
    │   ├── Preempted               a background call gave the model up to a turn
    │   └── ProbeFailed             (daemon.models.wire) a probe of `roost models` not made
    └── ChannelError                a messaging platform refused, failed or sent nonsense
        ├── DeliveryError           a reply could not be delivered
        ├── GraphError              (channels.whatsapp.api) a Graph API call failed
        ├── NotAnUpdate             (channels.telegram.parse) also a ValueError: not an Update
        └── NotAWebhook             (channels.whatsapp.parse) also a ValueError: not a webhook

The classes named with a module live there, next to the code that raises them, because they
carry that module's details (Meta's error codes, a store file). Every other exception class in
roost derives from one of these too (tests/daemon/core/test_errors.py walks the packages); a
private one is a `RoostError` used for control flow inside its module.

What roost catches: the errors of the library it calls (httpx, ollama, aiohttp, OSError, json),
where it calls it, translated into this tree. A broad `except Exception` stands only at a
boundary (the webhook route, the top of a turn, a scheduled job, a background fold, a tool
call) and logs with the traceback: a bug in roost's own code must read as a bug.
"""

from __future__ import annotations


class RoostError(Exception):
    """Root of every error roost raises on purpose."""


class ConfigError(RoostError):
    """A config file or setting is wrong; the message names the key and the file."""

    exit_status = 78  # EX_CONFIG from sysexits.h, which systemd understands

    def __init__(self, key: str, problem: str, source: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.source = source
        where = f" in {source}" if source else ""
        super().__init__(f"{key}{where}: {problem}")


class StoreError(RoostError):
    """The state directory cannot be read or written."""


class AttachmentError(RoostError):
    """An attachment was refused; the message is meant for the user and says what to do.

    `reason` (for callers and metrics, not the user): "too_large", "too_many_pixels", "damaged",
    "unsupported" or "missing".
    """

    def __init__(self, message: str, reason: str = "refused") -> None:
        self.reason = reason
        super().__init__(message)


class VoiceError(RoostError):
    """A voice note or audio file was not transcribed; the message is for the user and says why.

    `reason` (for callers and /metrics, not the user): "off", "too_long", "unreadable",
    "unavailable" (the backend is down or cannot load its model) or "failed" (it refused)."""

    def __init__(self, message: str, reason: str) -> None:
        self.reason = reason
        super().__init__(message)


class DocumentError(RoostError):
    """A document could not be read: damaged, encrypted, too big, too slow or hostile. The
    message is for the model (and through it the user) and says which."""


class WebError(RoostError):
    """A web page or search could not be fetched; the message says why, for the model."""


class WebRefused(WebError):
    """The address guard refused the URL: it leads to a private, loopback, link-local or
    metadata address, or uses a scheme other than http and https."""


class DoesNotFit(RoostError, ValueError):
    """The prefix and summary alone leave no room for even an excerpt of the newest message.

    Also a ValueError: the request cannot be built from these values (a budget too small)."""

    def __init__(self, needed: int, budget: int) -> None:
        self.needed = needed
        self.budget = budget
        super().__init__(f"the protected messages need {needed} tokens; the budget is {budget}")


class LLMError(RoostError):
    """The model server answered with an error. `host` names the server that answered so (its
    URL, credentials hidden), set by the model client: with several, the one to fail over from."""

    host: str | None = None


class LLMUnavailable(LLMError, ConnectionError):
    """Ollama cannot be reached at all."""


class LLMTimeout(LLMError, TimeoutError):
    """Ollama accepted the connection but stopped answering."""


class ModelNotFound(LLMError):
    """The configured model is not present on the Ollama server."""

    def __init__(self, model: str, message: str | None = None) -> None:
        self.model = model
        super().__init__(message or f"model {model!r} is not available on the Ollama server")


class ModelNowhere(ModelNotFound):
    """No host of a pool of several (`[model] hosts`) has the model, or may serve it (a host's
    `models`): the message names each host and the `ollama pull` line."""

    def __init__(self, model: str, hosts: tuple[str, ...]) -> None:
        self.hosts = hosts
        super().__init__(model, f"model {model!r} is on none of the Ollama hosts "
                                f"({', '.join(hosts)}); pull it on one with: ollama pull {model}")


class ContextOverflow(LLMError):
    """Ollama refused the prompt because it is larger than the context window."""

    def __init__(self, message: str, prompt_tokens: int | None, context_size: int | None) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_size = context_size
        super().__init__(message)


class PromptCut(ContextOverflow):
    """A server that ignores `truncate: false` cut the prompt silently, and cut it again when
    it was rebuilt at the ratio the first cut proved. `ratio` is that raised ratio."""

    def __init__(self, count: int, num_ctx: int, ratio: float) -> None:
        self.ratio = ratio
        super().__init__(f"Ollama cut the prompt to {count} tokens twice (num_ctx {num_ctx})",
                         None, num_ctx)


class ModelCrashed(LLMError):
    """Ollama answered 500 (or an error inside its stream) not naming the request: its runner
    failed. Tried once more at once; failing on, it is an outage like a refused connection."""


class Preempted(LLMError):
    """A background call (the fold) was cancelled so that a turn could use the model."""


class McpError(RoostError):
    """An MCP server is not running (yet, or any more), or a call to it failed."""


class Stopped(RoostError):
    """The user stopped the reply being written (/stop, or Ctrl-C in `roost chat`); the turn
    keeps what was written."""


class ChannelError(RoostError):
    """A messaging platform refused a request, could not be reached, or sent what roost
    cannot read."""


class DeliveryError(ChannelError):
    """A reply could not be delivered to the user.

    `permanent` means retrying this reply cannot help (the platform refused its content): the
    engine gives it up and tells the user. `chat_blocked` means the platform refuses the whole
    chat (the user blocked the bot): the engine marks the chat and sends it nothing more until
    the user writes again. `window_closed` means the platform takes messages to this user only
    after they write again (WhatsApp's 24 hours): the reply goes to `fallback` (a chat key, with
    `note` before it) when there is one, else it waits for the user's next message.
    """

    def __init__(self, message: str, *, permanent: bool = False, chat_blocked: bool = False,
                 window_closed: bool = False, fallback: str | None = None,
                 note: str = "") -> None:
        self.permanent = permanent or chat_blocked
        self.chat_blocked = chat_blocked
        self.window_closed = window_closed
        self.fallback = fallback
        self.note = note
        super().__init__(message)
