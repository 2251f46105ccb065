"""Converters: each takes a TOML value and returns the setting, or raises _Bad."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from daemon.core import crontab
from daemon.core.errors import RoostError


class _Bad(RoostError, ValueError):
    """A value is wrong; `where` is appended to the key (e.g. "[2]" for an array item)."""

    def __init__(self, problem: str, where: str = "") -> None:
        super().__init__(problem)
        self.where = where


Convert = Callable[[Any], Any]
_Spec = Mapping[str, Convert]
_TOML_TYPES = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
               dict: "table"}  # anything else tomllib returns is a date or time


def _value(kind: type, what: str, ok: Callable[[Any], object] | None = None, rule: str = "",
           then: Convert | None = None) -> Convert:
    """A converter: check the TOML type, then `ok(value)` (else "rule, got value"), then `then`."""

    def convert(value: Any) -> Any:
        if type(value) is not kind:  # not isinstance(): a TOML boolean must not pass as an integer
            raise _Bad(f"expected {what}, got {_TOML_TYPES.get(type(value), 'date/time')}")
        if ok is not None and not ok(value):
            raise _Bad(f"{rule}, got {value!r}")
        return value if then is None else then(value)

    return convert


def _speed(value: Any) -> float:
    """A speaking rate: a TOML integer or float from 0.5 to 2.0."""
    if type(value) not in (int, float):
        raise _Bad(f"expected a number such as 1.2, got "
                   f"{_TOML_TYPES.get(type(value), 'date/time')}")
    if not 0.5 <= value <= 2.0:
        raise _Bad(f"must be 0.5 to 2.0, got {value!r}")
    return float(value)


def _array(item: Convert) -> Convert:
    def convert(value: Any) -> tuple[Any, ...]:
        out = []
        for i, element in enumerate(_value(list, "an array")(value)):
            try:
                out.append(item(element))
            except _Bad as bad:
                raise _Bad(str(bad), f"[{i}]") from None
        return tuple(out)

    return convert


def _at_least(low: int) -> Convert:
    return _value(int, "an integer", lambda v: v >= low, f"must be at least {low}")


def _one_of(*options: str) -> Convert:
    return _value(str, "a string", options.__contains__, f"must be one of {' or '.join(options)}")


def _like(pattern: str, rule: str) -> Convert:
    return _value(str, "a string", re.compile(pattern).fullmatch, f"must be {rule}")


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile("([0-9]+(?:[.][0-9]+)?)(ms|s|m|h|d)")


def _seconds(text: str) -> float:
    if not re.fullmatch(f"(?:{_PART.pattern})+", text):
        raise _Bad(f"expected a duration like '90s', '30m', '3h', '1d' or '1h30m', got {text!r}")
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))


def _is_url(text: str) -> bool:
    parts = urlsplit(text)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _host_name(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9.-]+|\[?[0-9A-Fa-f:.]+\]?", text) is not None


def _valid_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


def _listen(text: str) -> tuple[str, int]:
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:([0-9]+)|([^:\[\]\s]+):([0-9]+)", text)
    if not match or int(match[2] or match[4]) > 65535:
        raise _Bad(f"expected 'host:port' or '[ipv6]:port', got {text!r}")
    return match[1] or match[3], int(match[2] or match[4])


def _schedule(text: str) -> str:
    if text.startswith("every "):
        every = text.removeprefix("every ").strip()
        if _seconds(every) < 60 or _seconds(every) % 60:
            raise _Bad(f"'every' takes whole minutes, at least '1m', got {every!r}")
        return text
    try:
        return crontab.check(text)
    except ValueError as exc:
        raise _Bad(str(exc)) from None


def _ollama_duration(text: str) -> bool:
    # Passed to Ollama as is, which parses it with Go's time.ParseDuration: no days there.
    return text in ("-1", "0") or ("d" not in text and _seconds(text) >= 0)


_TEXT = _value(str, "a string")
_STRING = _value(str, "a string", str.strip, "must not be empty")
_BOOL = _value(bool, "a boolean (true or false)")
_URL = _value(str, "a URL string", _is_url, "must be an http:// or https:// URL")
_BASE_URL = _value(str, "a URL string", _is_url, "must be an http:// or https:// URL",
                   lambda v: v.rstrip("/"))  # a bare host: paths are joined onto it
_DURATION = _value(str, "a duration string such as '20s'", then=_seconds)
_PERIOD = _value(str, "a duration string such as '3h'", lambda v: _seconds(v) > 0,
                 "must be longer than zero", _seconds)
_DIGITS = _like("[0-9]+", "digits only (no '+' or spaces)")
