"""How long each read-only `roost` command takes to answer, against `python -c pass`.

Runs each command a few times in a fresh interpreter (`python -m daemon ...`, as the `roost`
script does) on an empty state directory in a temporary folder, and prints the best wall time
of each, the same for `python -c pass` (the interpreter's own start-up, the floor), and the
ratio. Target (issue 20): each command under 0.3 s. Nothing here opens a connection.

Then what the heavy commands load before they do anything: the modules of `roost run` (and of
`roost doctor`), without an MCP server configured, against the same with the MCP SDK, which
they imported up front until it was deferred to the first server.

Run from the repository root: `python bench/cli_startup.py` (`--runs N`, default 5).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = (["--version"], ["--help"], ["pairing", "list"], ["conversations", "list"],
            ["automations", "list"], ["run", "--help"])


def best_of(argv: list[str], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, timeout=60)
        best = min(best, time.perf_counter() - started)
    return best


HEAVY = {"roost run's modules": "import daemon.app.serve",
         "roost doctor's modules": "import daemon.cli.doctor"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "roost.toml"
        config.write_text(f'[daemon]\nstate_dir = "{Path(folder) / "state"}"\n')
        floor = best_of([sys.executable, "-c", "pass"], runs)
        print(f"{'python -c pass':<28} {floor:6.3f} s  (the floor)")
        for command in COMMANDS:
            extra = ["--config", str(config)] if command[-1] == "list" else []
            took = best_of([sys.executable, "-m", "daemon", *command, *extra], runs)
            verdict = "ok" if took <= 0.3 else "OVER 0.3 s"
            print(f"{'roost ' + ' '.join(command):<28} {took:6.3f} s  x{took / floor:5.1f} "
                  f"the floor  {verdict}")
    for name, code in HEAVY.items():
        alone = best_of([sys.executable, "-c", code], runs)
        with_sdk = best_of([sys.executable, "-c", f"{code}; import mcp"], runs)
        print(f"{name:<28} {alone:6.3f} s  with the MCP SDK {with_sdk:6.3f} s  "
              f"x{alone / with_sdk:4.2f}")


if __name__ == "__main__":
    main()
