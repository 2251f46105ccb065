"""roost: talk to the LLM on your own GPU box from your phone."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("roost")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
