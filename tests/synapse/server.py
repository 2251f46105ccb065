"""Synapse, the reference Matrix homeserver, run from its own venv on a loopback port.

Synapse pins its own dependencies (Twisted and friends), so it lives in .venv-synapse/ at the
root of the checkout (out of tests/, which the tests themselves walk),
apart from roost's venv; .ci/run installs it there. One `Homeserver` is a data directory (config,
signing key, SQLite database, media, log) and a port: `stop()` then `start()` brings the same
server back with its users, rooms and devices, as after a restart in production.

Everything here blocks (subprocess and urllib): call it from sync fixtures as is, and from async
tests through the `a`-prefixed twins, which run it in a thread so the test's event loop (and the
bot under test in it) keeps running.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VENV_PYTHON = Path(__file__).resolve().parents[2] / ".venv-synapse" / "bin" / "python"

START_TIMEOUT = 90.0  # Synapse's first start creates its schema: ~5 s here, far more under load
STOP_TIMEOUT = 20.0
SHM = Path("/dev/shm")

# Every rate limit Synapse has, raised so that no test ever meets a 429: tests register, log in,
# create rooms, join and send far faster than a person.
_UNLIMITED = {"per_second": 10_000, "burst_count": 100_000}
RATE_LIMITS: dict[str, Any] = {
    "rc_message": _UNLIMITED,
    "rc_registration": _UNLIMITED,
    "rc_registration_token_validity": _UNLIMITED,
    "rc_login": {"address": _UNLIMITED, "account": _UNLIMITED, "failed_attempts": _UNLIMITED},
    "rc_admin_redaction": _UNLIMITED,
    "rc_joins": {"local": _UNLIMITED, "remote": _UNLIMITED},
    "rc_joins_per_room": _UNLIMITED,
    "rc_3pid_validation": _UNLIMITED,
    "rc_invites": {"per_room": _UNLIMITED, "per_user": _UNLIMITED, "per_issuer": _UNLIMITED},
    "rc_third_party_invite": _UNLIMITED,
    "rc_key_requests": _UNLIMITED,
    "rc_media_create": _UNLIMITED,
    "rc_presence": {"per_user": _UNLIMITED},
    "rc_delayed_event_mgmt": _UNLIMITED,
    "rc_room_creation": _UNLIMITED,
    "rc_reports": _UNLIMITED,
    "rc_user_directory": _UNLIMITED,
    "rc_profile": _UNLIMITED,
}


class SynapseError(RuntimeError):
    """Synapse would not start, stop or answer as expected (the message has its log's tail)."""


@dataclass(frozen=True)
class Registered:
    """A user made by the shared-secret admin API, logged in on one device."""

    user_id: str
    access_token: str
    device_id: str

    def __iter__(self) -> Iterator[str]:  # user_id, token, device = server.register(...)
        return iter((self.user_id, self.access_token, self.device_id))


def synapse_available() -> str | None:
    """Why Synapse cannot run here, or None when .venv-synapse has it."""
    if not VENV_PYTHON.exists():
        return "no Synapse in .venv-synapse (.ci/run installs it)"
    # Finding it is enough (importing it takes 2 s); a broken install fails start() loudly.
    find = "import importlib.util, sys; sys.exit(importlib.util.find_spec('synapse') is None)"
    probe = subprocess.run(
        [str(VENV_PYTHON), "-c", find],
        env=_child_env(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        return "no Synapse in .venv-synapse (.ci/run installs it)"
    return None


def _child_env() -> dict[str, str]:
    """Synapse's environment: none of roost's venv, and its own installed bytecode.

    The test session points PYTHONPYCACHEPREFIX at a folder of roost's bytecode; inherited, it
    would hide the .pyc files pip wrote into Synapse's venv, and every start would compile all of
    Synapse and Twisted again (seconds of CPU on each start)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _signing_key() -> str:
    """An ed25519 signing key in Synapse's file format ("ed25519 VERSION SEED", unpadded base64),
    as `--generate-keys` would write it (without starting Synapse once more to do so)."""
    seed = base64.b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return f"ed25519 a_{secrets.token_hex(2)} {seed}\n"


class Homeserver:
    """One Synapse process over one data directory, on 127.0.0.1 only (no federation listener).

        server = Homeserver(); server.start()
        user_id, token, device_id = server.register("alice", "secret")
        server.stop(); server.start()   # same port, same database: alice is still there
        server.close()                  # stops it and removes the directory it made
    """

    def __init__(
        self, directory: Path | None = None, *, server_name: str = "localhost"
    ) -> None:
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="roost-synapse-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        # The SQLite database in memory where it can be (tmpfs): Synapse keeps SQLite's
        # synchronous=FULL, and every event it persists waits for an fsync on disk (sending a
        # message takes ~40% longer with the database on /tmp here).
        self.database_dir = self.directory
        if SHM.is_dir() and os.access(SHM, os.W_OK):
            self.database_dir = Path(tempfile.mkdtemp(prefix="roost-synapse-db-", dir=SHM))
        self.server_name = server_name
        self.port = _free_port()
        self.shared_secret = secrets.token_hex(32)
        self._secrets = {"macaroon_secret_key": secrets.token_hex(32),
                         "form_secret": secrets.token_hex(32)}
        self.log_path = self.directory / "homeserver.log"
        self.output_path = self.directory / "stdout.log"  # what Synapse prints before logging
        self.config_path = self.directory / "homeserver.yaml"
        self.startup_seconds: list[float] = []  # each start's time until /versions answered
        self._process: subprocess.Popen[bytes] | None = None
        (self.directory / "signing.key").write_text(_signing_key())
        self._write_config()

    @property
    def url(self) -> str:
        """The client-server API's base URL, e.g. http://127.0.0.1:38211."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _write_config(self) -> None:
        log_config = {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {
                "precise": {
                    "format": "%(asctime)s %(name)s %(lineno)d %(levelname)s %(request)s "
                    "%(message)s"
                }
            },
            "filters": {"context": {"()": "synapse.logging.context.LoggingContextFilter"}},
            "handlers": {
                "file": {
                    "class": "logging.FileHandler",
                    "filename": str(self.log_path),
                    "formatter": "precise",
                    "filters": ["context"],
                    "encoding": "utf8",
                }
            },
            # INFO has one line a request: what a failing test wants to read.
            "loggers": {"synapse.storage.SQL": {"level": "WARNING"}},
            "root": {"level": "INFO", "handlers": ["file"]},
        }
        log_config_path = self.directory / "log.yaml"
        log_config_path.write_text(json.dumps(log_config, indent=2))  # JSON is YAML
        config: dict[str, Any] = {
            "server_name": self.server_name,
            "public_baseurl": self.url + "/",
            "pid_file": str(self.directory / "homeserver.pid"),
            "report_stats": False,
            "listeners": [
                {
                    "port": self.port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": False,
                    "x_forwarded": False,
                    "resources": [{"names": ["client"], "compress": False}],
                }
            ],
            "database": {
                "name": "sqlite3",
                "args": {"database": str(self.database_dir / "homeserver.db")},
            },
            "log_config": str(log_config_path),
            "media_store_path": str(self.directory / "media"),
            "signing_key_path": str(self.directory / "signing.key"),
            "registration_shared_secret": self.shared_secret,
            **self._secrets,
            "enable_registration": False,
            # Cheap password hashes: every register and login hashes (12 rounds take ~0.3 s).
            "bcrypt_rounds": 4,
            # Nothing leaves this machine: no key servers, no federation, no previews, no stats.
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "federation_domain_whitelist": [],
            "url_preview_enabled": False,
            "presence": {"enabled": False},
            "enable_metrics": False,
            **RATE_LIMITS,
        }
        self.config_path.write_text(json.dumps(config, indent=2))

    # -- process ----------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start Synapse (again) and wait until the client API answers."""
        if self.running:
            return
        if not VENV_PYTHON.exists():
            raise SynapseError("no Synapse in .venv-synapse (.ci/run installs it)")
        for _ in range(3):
            began = time.monotonic()
            if self._launch(began + timeout):
                self.startup_seconds.append(time.monotonic() - began)
                return
            if self.startup_seconds:  # a restart keeps its port (the clients know it)
                break
            # Another process took the free port between _free_port() and Synapse's bind.
            self.port = _free_port()
            self._write_config()
        raise SynapseError(f"Synapse could not listen on port {self.port}\n{self.log_tail()}")

    def _launch(self, deadline: float) -> bool:
        """Run Synapse until /_matrix/client/versions answers: True; False when its port was
        taken; SynapseError on any other failure."""
        log_size = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.output_path.open("ab") as output:
            process = self._process = subprocess.Popen(
                [str(VENV_PYTHON), "-m", "synapse.app.homeserver", "-c", str(self.config_path)],
                cwd=self.directory,
                env=_child_env(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                # In the test run's process group: a Ctrl-C at the terminal stops it too.
            )
        while True:
            if process.poll() is not None:
                self._process = None
                with self.log_path.open("rb") as log:
                    log.seek(log_size)
                    if b"Address already in use" in log.read():
                        return False
                raise SynapseError(
                    f"Synapse exited with {process.returncode} while starting\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/_matrix/client/versions", timeout=5):
                    return True
            if time.monotonic() > deadline:
                self.stop()
                raise SynapseError(
                    f"Synapse did not answer on {self.url} in time\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, as systemd stops it; SIGKILL if it has not exited within `timeout`."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def close(self) -> None:
        """Stop, and remove the database and the data directory when this object made them."""
        self.stop()
        if self.database_dir != self.directory:
            shutil.rmtree(self.database_dir, ignore_errors=True)
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Homeserver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of Synapse's log and of what it printed, for an error message."""
        parts = []
        for path in (self.output_path, self.log_path):
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            if text:
                parts.append(f"--- {path.name} ---\n" + "\n".join(text[-lines:]))
        return "\n".join(parts) or "(Synapse wrote no log)"

    # -- API --------------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None
    ) -> dict[str, Any]:
        """One JSON request to the homeserver; an error status raises with Synapse's answer."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer: dict[str, Any] = json.load(response)
                return answer
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            raise SynapseError(f"{method} {path}: {error.code} {detail}") from None

    def user_id(self, localpart: str) -> str:
        return f"@{localpart.lower()}:{self.server_name}"

    def register(
        self,
        localpart: str,
        password: str,
        admin: bool = False,
        displayname: str | None = None,
    ) -> Registered:
        """A new user through the shared-secret admin API (/_synapse/admin/v1/register), as
        `register_new_matrix_user` does: a nonce, then HMAC-SHA1 keyed with the shared secret
        over nonce NUL user NUL password NUL "admin"|"notadmin". Logged in on a new device."""
        path = "/_synapse/admin/v1/register"
        nonce = self.request("GET", path)["nonce"]
        mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join((
            nonce.encode(),
            localpart.encode(),
            password.encode(),
            b"admin" if admin else b"notadmin",
        )))
        body: dict[str, Any] = {
            "nonce": nonce,
            "username": localpart,
            "password": password,
            "admin": admin,
            "mac": mac.hexdigest(),
        }
        if displayname is not None:
            body["displayname"] = displayname
        answer = self.request("POST", path, body)
        return Registered(answer["user_id"], answer["access_token"], answer["device_id"])

    def login(self, localpart: str, password: str, device_id: str | None = None) -> Registered:
        """A password login (m.login.password), as a client would after a restart."""
        body: dict[str, Any] = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": localpart},
            "password": password,
        }
        if device_id:
            body["device_id"] = device_id
        answer = self.request("POST", "/_matrix/client/v3/login", body)
        return Registered(answer["user_id"], answer["access_token"], answer["device_id"])

    # -- the same from async tests ----------------------------------------------------------

    async def astart(self, timeout: float = START_TIMEOUT) -> None:  # noqa: ASYNC109
        await asyncio.to_thread(self.start, timeout)

    async def astop(self, timeout: float = STOP_TIMEOUT) -> None:  # noqa: ASYNC109
        await asyncio.to_thread(self.stop, timeout)

    async def aregister(
        self, localpart: str, password: str, admin: bool = False, displayname: str | None = None
    ) -> Registered:
        return await asyncio.to_thread(self.register, localpart, password, admin, displayname)

    async def alogin(
        self, localpart: str, password: str, device_id: str | None = None
    ) -> Registered:
        return await asyncio.to_thread(self.login, localpart, password, device_id)
