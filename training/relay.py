"""Run a launcher (torchrun, accelerate launch) so that the requeue signal reaches the training ranks.

    python -m training.relay --signal USR2 -- torchrun --nnodes 2 ... -m training --spec spec.json

Neither torchrun nor `accelerate launch` handles SIGUSR1/SIGUSR2: the signal's default action kills
the launcher, the ranks lose their parent, and the checkpoint on signal never happens. And on SIGTERM
(what Slurm sends every process of the job when it preempts it) torchrun stops its ranks itself,
SIGKILL after 30 s, and exits as failed. So with requeue on, SIGTERM is a warning like the signal:
the relay starts the launcher with both ignored (the ranks inherit that until training.requeue
installs its handlers; torchrun is told to leave SIGTERM alone, TORCHELASTIC_SIGNALS_TO_HANDLE) and
passes each one it gets on to every process under the launcher, again every few seconds until the
launcher ends (a rank still starting up when the first came has its handler by then). Where Slurm
signals every process of the step itself, a rank gets the signal several times: the handler only
sets a flag. SIGINT goes to the launcher, which stops its ranks. The relay exits with the launcher's
status, or EXIT_REQUEUE when the ranks left for a requeue (their marker, training/requeue.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

REPEAT_S = 5.0  # how often a warning is passed on again while the launcher runs


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
    return int(getattr(signal, name if name.startswith("SIG") else f"SIG{name}"))


def launcher_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment: torch.distributed.elastic (torchrun, multi-process accelerate) must
    not install its SIGTERM handler over the ignored SIGTERM it inherits."""
    env = dict(os.environ if env is None else env)
    handled = env.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = ",".join(s for s in handled.split(",") if s.strip() not in ("SIGTERM", ""))
    return env


def run(cmd: list[str], signal_name: str | None) -> tuple[int, bool]:
    """Run `cmd`, relaying `signal_name` and SIGTERM to its process tree; (exit status, whether one was
    relayed)."""
    if signal_name is None:
        return subprocess.run(cmd, check=False).returncode, False
    warnings = sorted({_signum(signal_name), int(signal.SIGTERM)})
    # Ignored from here on: inherited by the launcher and its ranks.
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in warnings}
    proc = subprocess.Popen(cmd, env=launcher_env())
    got: list[int] = []

    def relay(number: int, frame: object) -> None:
        if number not in got:
            got.append(number)
        targets = descendants(proc.pid)
        print(
            f"training.relay: signal {number} -> {len(targets)} processes under pid {proc.pid}",
            file=sys.stderr,
            flush=True,
        )
        _send(targets, number)

    def stop(number: int, frame: object) -> None:
        proc.send_signal(number)

    for s in warnings:
        signal.signal(s, relay)
    old_int = signal.signal(signal.SIGINT, stop)
    try:
        while True:
            try:
                return proc.wait(timeout=REPEAT_S), bool(got)
            except subprocess.TimeoutExpired:
                targets = descendants(proc.pid)
                for number in got:  # again, for ranks that had no handler yet the first time
                    _send(targets, number)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.signal(signal.SIGINT, old_int)


def _send(pids: list[int], number: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass


def left_for_requeue(cmd: list[str]) -> bool:
    """Whether the ranks of the training that `cmd` launches (its `--spec`) left for a requeue: in a
    Slurm job rank 0's marker for this attempt, elsewhere a checkpoint (as training.ranks judges)."""
    import json

    from training import requeue

    specs = [cmd[i + 1] for i, word in enumerate(cmd[:-1]) if word == "--spec"]
    if not specs:
        return False
    try:
        checkpoints = Path(json.loads(Path(specs[-1]).read_text())["job_dir"]) / "checkpoints"
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if "SLURM_JOB_ID" in os.environ:
        return requeue.marker(checkpoints).exists()
    return requeue.newest_checkpoint(checkpoints) is not None


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
    rc, relayed = run(cmd, args.signal)
    if rc != 0 and relayed and left_for_requeue(cmd):
        from training.requeue import EXIT_REQUEUE

        return EXIT_REQUEUE  # the launcher reports the ranks' "requeue me" as a failure of its own
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
