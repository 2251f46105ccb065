"""pytest fixtures for a real Synapse: one homeserver per xdist worker, shared by its tests.

A conftest.py takes them by name (an import would read to ruff as an unused name that each
test's parameter shadows, F811):

    from tests.synapse import fixtures

    synapse_session = fixtures.synapse_session
    synapse = fixtures.synapse
    matrix_localpart = fixtures.matrix_localpart

or tests/conftest.py registers them for every folder: pytest_plugins = ["tests.synapse.fixtures"].

`synapse` is the worker's homeserver, started again first if an earlier test stopped it and
failed before starting it again. Tests share it, so every user they register needs a name of
its own: `matrix_localpart("alice")` gives "alice-3f9a0c1e".
"""

from __future__ import annotations

import importlib.util
import secrets
from collections.abc import Callable

import pytest

from tests.synapse.server import Homeserver, synapse_available


def matrix_nio_missing() -> str | None:
    """Why roost's venv cannot run the Matrix tests' clients, or None.

    matrix-nio 0.26 encrypts with vodozemac (its `e2e` extra); releases before 0.25 used
    python-olm. Either way nio says whether it can: nio.crypto.ENCRYPTION_ENABLED."""
    if importlib.util.find_spec("nio") is None:
        return "no matrix-nio in roost's venv (pip install 'matrix-nio[e2e]')"
    from nio.crypto import ENCRYPTION_ENABLED

    if not ENCRYPTION_ENABLED:
        return "matrix-nio without its end-to-end encryption (pip install 'matrix-nio[e2e]')"
    return None


# The worker's one homeserver, whichever conftest (tests/synapse, tests/channels/matrix...)
# imported the fixtures: each import is a fixture definition of its own, with its own session
# instance, and without this they would start one Synapse each.
_server: Homeserver | None = None


@pytest.fixture(scope="session")
def synapse_session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Homeserver:
    """This worker's one Synapse (its config and log stay in pytest's tmp, its database, in
    /dev/shm, goes when the session ends)."""
    global _server
    reason = synapse_available() or matrix_nio_missing()
    if reason:
        pytest.skip(reason)
    if _server is None:
        server = Homeserver(tmp_path_factory.mktemp("synapse"))
        request.config.add_cleanup(server.close)  # once, at the end of the session
        server.start()
        _server = server
    return _server


@pytest.fixture
def synapse(synapse_session: Homeserver) -> Homeserver:
    """The worker's Synapse, running."""
    synapse_session.start()  # no-op when it runs
    return synapse_session


def unique_localpart(prefix: str = "user") -> str:
    """A Matrix localpart no other test on this homeserver has (lower case, as Synapse wants)."""
    return f"{prefix.lower()}-{secrets.token_hex(4)}"


@pytest.fixture
def matrix_localpart() -> Callable[[str], str]:
    return unique_localpart
