"""Entry point: python -m training --spec /abs/path/spec.json  (see training/__init__.py)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import training
from training import console

# The process' start, near enough (the imports above are light): its first heartbeat is due that long
# after it (training.console), whatever the job imported before the console could speak.
STARTED = time.monotonic()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training", description=training.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spec", required=True, help="path to the job's spec.json (docs/contracts.md)")
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="download and cache the data, tokenized splits and model, then stop (jobgen prefetch)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from training.hardware import DeviceError
    from training.run import prepare_only, run
    from training.spec import SpecError, load

    try:
        spec = load(args.spec)
    except (SpecError, OSError, ValueError) as exc:
        console.line(f"training: {exc}", err=True)
        return 2
    try:
        return prepare_only(spec) if args.prepare_only else run(spec, Path(args.spec), started=STARTED)
    except (SpecError, DeviceError) as exc:  # what only the data, the model or the node can tell
        console.line(f"training: {exc}", err=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
