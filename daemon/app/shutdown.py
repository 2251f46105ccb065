"""The one shutdown budget: `daemon.shutdown_grace` split into the steps of a stop."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShutdownBudget:
    """`daemon.shutdown_grace` split into the steps of a stop, so that they add up to it."""

    drain: float  # turns in flight may finish
    http: float  # aiohttp waits for open requests
    unwind: float  # each step of cancelling what is left (rotation, workers, folds)


SHUTDOWN_RESERVE = 4.0  # seconds at most kept from the drain for the rest of the stop
UNWIND_STEPS = 5  # the steps that get `unwind` each: the scheduler's runs, 4 of the engine's


def shutdown_budget(grace: float) -> ShutdownBudget:
    """The one shutdown budget: the drain gets all but a reserve (a quarter of the grace, at
    most SHUTDOWN_RESERVE), shared by aiohttp's wait and the engine's cancelling steps. The
    store and the channels' clients close in well under a second after that."""
    reserve = min(SHUTDOWN_RESERVE, grace / 4)
    share = reserve / (1 + UNWIND_STEPS)
    return ShutdownBudget(drain=grace - reserve, http=share, unwind=share)
