"""`python crash_after_checkpoint.py --spec SPEC`: the training entrypoint, on a node that breaks.

On the node named by CRASH_ON the rank dies (exit 3) as soon as the first checkpoint of the training
(checkpoints/step-*.ckpt, renamed into place whole) is there, as on a node whose GPU fails mid-run;
anywhere else the training runs as `python -m training` would.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
from pathlib import Path


def _break_after_first_checkpoint(folder: Path) -> None:
    while not any(folder.glob("step-*.ckpt")):
        time.sleep(0.05)
    print(f"crash: {os.environ.get('SLURMD_NODENAME')} breaks after the first checkpoint", file=sys.stderr, flush=True)
    os._exit(3)


if os.environ.get("CRASH_ON") == os.environ.get("SLURMD_NODENAME"):
    spec = Path(sys.argv[sys.argv.index("--spec") + 1])
    threading.Thread(target=_break_after_first_checkpoint, args=(spec.parent / "checkpoints",), daemon=True).start()
sys.argv[0] = "training"
runpy.run_module("training", run_name="__main__", alter_sys=True)
