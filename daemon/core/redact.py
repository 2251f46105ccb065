"""Credentials in URLs never leave the process: `http://user:pw@host` is shown `http://***@host`.

`redact_url` is for settings shown on purpose (doctor, notices, /status); `RedactingFilter` is
the net under every log line, since an exception's text may quote a URL too.
"""

from __future__ import annotations

import logging
import re

# scheme://userinfo@ : userinfo is anything up to the first @ before the host part ends.
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s\"'<>]+@")


def redact_url(text: str) -> str:
    """`text` with the user and password of every URL in it replaced by `***`."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


class RedactingFilter(logging.Filter):
    """Rewrites each record's message (arguments and traceback included) without credentials."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact_url(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            if redact_url(text) != text:  # keep the traceback, minus the credentials
                record.msg = f"{record.msg}\n{redact_url(text)}"
                record.args, record.exc_info, record.exc_text = None, None, None
        return True
