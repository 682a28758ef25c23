"""Run a launcher (torchrun, accelerate launch) so that the requeue signal reaches the training ranks.

    python -m training.relay --signal USR2 -- torchrun --nnodes 2 ... -m training --spec spec.json

Neither torchrun nor `accelerate launch` handles SIGUSR1/SIGUSR2: the signal's default action kills
the launcher, the ranks lose their parent, and the checkpoint on signal never happens. The relay
starts the launcher with the signal ignored (the ranks inherit that until training.requeue installs
its handler) and passes each signal it gets on to every process under the launcher. Where Slurm
signals every process of the step itself, a rank gets the signal twice: the handler only sets a flag.
SIGTERM and SIGINT go to the launcher, which stops its ranks. The relay exits with the launcher's status.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import cast


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command name (2nd field) may hold spaces and parentheses: read after the last ')'.
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo += children.get(child, [])
    return out


def _signum(name: str) -> int:
    return cast(int, getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


def run(cmd: list[str], signal_name: str | None) -> tuple[int, bool]:
    """Run `cmd`, relaying `signal_name` to its process tree; (exit status, whether one was relayed)."""
    relayed = False
    if signal_name is None:
        return subprocess.run(cmd, check=False).returncode, relayed
    signum = _signum(signal_name)
    previous = signal.signal(signum, signal.SIG_IGN)  # inherited by the launcher and its ranks
    proc = subprocess.Popen(cmd)

    def relay(number: int, frame: object) -> None:
        nonlocal relayed
        relayed = True
        targets = descendants(proc.pid)
        print(
            f"training.relay: signal {number} -> {len(targets)} processes under pid {proc.pid}",
            file=sys.stderr,
            flush=True,
        )
        for pid in targets:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass

    def stop(number: int, frame: object) -> None:
        proc.send_signal(number)

    signal.signal(signum, relay)
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                return proc.wait(), relayed
            except InterruptedError:  # pragma: no cover - wait() retries on EINTR itself
                continue
    finally:
        signal.signal(signum, previous)
        for s, handler in old.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.relay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--signal", default=None, help="signal to pass on to the ranks (USR2, ...); none = just run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- launcher and its arguments")
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("give the launcher command after --")
    rc, _ = run(cmd, args.signal)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
