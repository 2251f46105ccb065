"""The one error hierarchy of roost.

    RoostError
    ├── ConfigError                 a bad config file or setting (exit status 78)
    ├── StoreError                  the state directory cannot be read or written
    ├── LLMError                    anything the model server answered badly
    │   ├── LLMUnavailable          also a ConnectionError: Ollama cannot be reached
    │   ├── LLMTimeout              also a TimeoutError: Ollama stopped answering
    │   ├── ModelNotFound           the configured model is not pulled
    │   ├── ContextOverflow         Ollama refused a prompt larger than num_ctx
    │   ├── ModelCrashed            a 500: the runner failed on this request (retried once)
    │   └── Preempted               a background call gave the model up to a turn
    └── ChannelError                a messaging platform refused or failed
        └── DeliveryError           a reply could not be delivered
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


class LLMError(RoostError):
    """The model server answered with an error."""


class LLMUnavailable(LLMError, ConnectionError):
    """Ollama cannot be reached at all."""


class LLMTimeout(LLMError, TimeoutError):
    """Ollama accepted the connection but stopped answering."""


class ModelNotFound(LLMError):
    """The configured model is not present on the Ollama server."""

    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"model {model!r} is not available on the Ollama server")


class ContextOverflow(LLMError):
    """Ollama refused the prompt because it is larger than the context window."""

    def __init__(self, message: str, prompt_tokens: int | None, context_size: int | None) -> None:
        self.prompt_tokens = prompt_tokens
        self.context_size = context_size
        super().__init__(message)


class ModelCrashed(LLMError):
    """Ollama answered 500: its runner failed on this request; worth one more try."""


class Preempted(LLMError):
    """A background call (the fold) was cancelled so that a turn could use the model."""


class ChannelError(RoostError):
    """A messaging platform refused a request or could not be reached."""


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
