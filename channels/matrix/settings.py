"""The `[matrix]` settings: the homeserver, the bot's account and device, who may talk.

The password and access token are secrets: they come from the environment
(ROOST_MATRIX_PASSWORD, ROOST_MATRIX_TOKEN) or systemd credentials, never the config file, and
never show in a repr.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MatrixSettings:
    enabled: bool = False
    homeserver: str = ""  # base URL, e.g. https://matrix.example.org
    user_id: str = ""  # the bot, @roost:example.org
    # Kept stable so the device's encryption keys survive restarts; empty: the first login's
    # device is stored (<state_dir>/matrix/) and reused.
    device_id: str = ""
    device_name: str = "roost"  # what people see in their list of the bot's sessions
    allow: tuple[str, ...] = ()  # Matrix user ids that may talk without pairing
    require_mention: bool = True  # in a group room, answer only when mentioned or replied to
    streaming: str = "edit"  # or "off": the reply sent once, then edited as it is written
    stream_interval: float = 1.5  # seconds between two edits of a reply being written
    password: str = field(default="", repr=False)  # ROOST_MATRIX_PASSWORD
    access_token: str = field(default="", repr=False)  # ROOST_MATRIX_TOKEN
