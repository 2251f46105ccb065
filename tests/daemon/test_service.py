"""Running as a service: the units, the notify protocol, private files, no leaked credentials."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from daemon.core.config import SECRETS, DaemonSettings
from daemon.core.platforms import installed
from tests.daemon.app.test_app import free_port
from tests.fakes.ollama import FakeOllama

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"
ROOST = Path(sys.executable).parent / "roost"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def _runnable_copy(unit: Path, tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's roost (verify wants it to exist)."""
    text = unit.read_text()
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={ROOST}", text, flags=re.MULTILINE)
    copy = tmp_path / unit.name
    copy.write_text(text)
    return copy


@needs_analyze
@pytest.mark.parametrize(("unit", "user"), [("roost.service", False),
                                            ("roost-user.service", True)])
def test_units_pass_systemd_analyze_verify(tmp_path: Path, unit: str, user: bool) -> None:
    if not ROOST.exists():
        pytest.skip("the roost console script is not installed next to this interpreter")
    copy = _runnable_copy(UNITS / unit, tmp_path)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    command = [str(ANALYZE), *(["--user"] if user else []), "verify", str(copy)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@needs_analyze
def test_system_unit_exposure_is_at_most_2() -> None:
    result = subprocess.run([str(ANALYZE), "security", "--offline=true",
                             str(UNITS / "roost.service")],
                            capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for roost\.service: ([0-9.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 2.0


def test_units_ask_for_what_the_daemon_does() -> None:
    for unit in ("roost.service", "roost-user.service"):
        text = (UNITS / unit).read_text()
        for line in ("Type=notify", "WatchdogSec=", "StateDirectory=roost",
                     "StateDirectoryMode=0700", "UMask=0077", "Restart=on-failure",
                     "RestartPreventExitStatus=78", "LimitNOFILE=", "LoadCredential="):
            assert line in text, f"{unit} lacks {line}"


def test_both_units_name_every_secret_roost_reads() -> None:
    """Each secret has its LoadCredential= line (commented until used) in both units, so
    uncommenting is all a user (or `roost init`) has to do."""
    names = {name for table in SECRETS.values() for name in table.values()} | {
        name for platform in installed().values() for name in platform.secrets.values()}
    for unit in ("roost.service", "roost-user.service"):
        lines = re.findall(r"(?m)^#?LoadCredential=(\w+):\S*/\1$",
                           (UNITS / unit).read_text())
        assert set(lines) == names, unit


@pytest.fixture
async def notify_socket() -> AsyncIterator[tuple[socket.socket, str]]:
    folder = tempfile.mkdtemp(prefix="roost-notify-")  # short: AF_UNIX paths are limited
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    try:
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


async def _next_datagram(sock: socket.socket) -> str:
    # A minute: the first one comes once roost started, far slower on a loaded machine.
    async with asyncio.timeout(60):
        return (await asyncio.get_running_loop().sock_recv(sock, 4096)).decode()


async def test_run_tells_systemd_ready_watchdog_and_stopping(
    fake_ollama: FakeOllama, tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    port = free_port()
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'listen = "127.0.0.1:{port}"\n[model]\nhost = "{fake_ollama.url}"\n')
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        seen = [await _next_datagram(sock)]
        # READY=1 comes once the server answers: /healthz works by then.
        async with aiohttp.ClientSession() as http, \
                http.get(f"http://127.0.0.1:{port}/healthz") as reply:
            assert reply.status == 200
        while seen.count("WATCHDOG=1") < 3:
            seen.append(await _next_datagram(sock))
        assert seen[0] == "READY=1"
        daemon.send_signal(signal.SIGTERM)
        while "STOPPING=1" not in seen:
            seen.append(await _next_datagram(sock))
        _, err = await asyncio.wait_for(daemon.communicate(), 20)
        assert daemon.returncode == 0, err.decode()
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()


async def test_a_stuck_event_loop_stops_the_watchdog_pings_until_it_runs_again(
    fake_ollama: FakeOllama, tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    """The pings come from the event loop itself: while it is stuck, systemd hears nothing (and
    restarts the service after WatchdogSec); once it runs again, the pings resume."""
    sock, path = notify_socket
    port = free_port()
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n'
                      f'listen = "127.0.0.1:{port}"\n[model]\nhost = "{fake_ollama.url}"\n')
    # Pings every 0.1 s; the loop is stuck for 1.5 s, fifteen intervals.
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).parent / "stuck_loop_child.py"), "1.5",
        "run", "--config", str(config), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        seen = [await _next_datagram(sock)]
        while seen.count("WATCHDOG=1") < 2:
            seen.append(await _next_datagram(sock))
        assert seen[0] == "READY=1"
        daemon.send_signal(signal.SIGUSR1)
        while seen[-1] != "X-ROOST-TEST=unblocked":
            seen.append(await _next_datagram(sock))
        # One process sends them all, in order: what lies between the markers was sent while
        # the loop was stuck.
        stuck = seen[seen.index("X-ROOST-TEST=blocked") + 1:-1]
        assert stuck == []
        assert await _next_datagram(sock) == "WATCHDOG=1"  # the loop runs: pings again
        daemon.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(daemon.communicate(), 20)
        assert daemon.returncode == 0, err.decode()
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()


def _modes(root: Path) -> dict[str, int]:
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        if not path.is_symlink():
            found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return found


async def test_state_is_private_under_umask_022_and_no_password_is_shown(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    password = "hunter2-Secret"
    host = fake_ollama.url.replace("http://", f"http://roost:{password}@")
    state = tmp_path / "state"
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\n[model]\nhost = "{host}"\n')
    fake_ollama.script("a reply")
    chat = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "chat", "-v", "--config", str(config),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, preexec_fn=lambda: os.umask(0o022))
    out, err = await asyncio.wait_for(chat.communicate(b"hello there\n/status\n"), 60)
    assert chat.returncode == 0, err.decode()
    assert b"a reply" in out
    modes = _modes(state)
    assert any(name.startswith("conversations/") and name.endswith(".json") for name in modes)
    assert any(name.startswith("debug/") for name in modes)
    for name, mode in modes.items():
        path = state / name
        assert mode == (0o700 if path.is_dir() else 0o600), f"{name}: {mode:04o}"
    doctor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "doctor", "--config", str(config),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    d_out, d_err = await asyncio.wait_for(doctor.communicate(), 60)
    assert b"http://***@127.0.0.1" in d_out
    await fake_ollama.refuse_connections()  # the outage notice and its log lines, too
    again = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "chat", "-v", "--config", str(config),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    a_out, a_err = await asyncio.wait_for(again.communicate(b"are you there\n"), 60)
    assert b"***@" in a_out + a_err
    everything = b"".join([out, err, d_out, d_err, a_out, a_err] + [
        p.read_bytes() for p in state.rglob("*") if p.is_file()])
    assert password.encode() not in everything


async def test_start_up_warns_when_the_state_directory_is_readable_by_others(
    fake_ollama: FakeOllama, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    config = tmp_path / "roost.toml"
    config.write_text(f'[daemon]\nstate_dir = "{state}"\nlisten = "127.0.0.1:{free_port()}"\n'
                      f'[model]\nhost = "{fake_ollama.url}"\n')
    daemon = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon", "run", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    lines: list[bytes] = []
    try:
        assert daemon.stderr is not None
        async with asyncio.timeout(30):
            while not lines or b"listening on" not in lines[-1]:
                lines.append(await daemon.stderr.readline())
                assert lines[-1], b"".join(lines)
        warned = [line for line in lines if b"readable by others (mode 0755)" in line]
        assert len(warned) == 1 and b"chmod 700" in warned[0]
    finally:
        daemon.send_signal(signal.SIGTERM)
        await asyncio.wait_for(daemon.communicate(), 30)


def test_the_default_shutdown_budget_fits_the_units_stop_timeout() -> None:
    # shutdown_grace bounds roost's whole stop; systemd kills what overruns TimeoutStopSec.
    grace = DaemonSettings.shutdown_grace
    for unit in ("roost.service", "roost-user.service"):
        found = re.search(r"^TimeoutStopSec=(\d+)$", (UNITS / unit).read_text(), re.MULTILINE)
        assert found, f"{unit} sets no TimeoutStopSec"
        assert grace + 5 <= int(found.group(1)), unit
