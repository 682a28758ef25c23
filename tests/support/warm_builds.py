"""Build what the test suite's ranks would otherwise build on the way: DeepSpeed's CPU comm extension
(deepspeed_shm_comm, JIT-compiled by the first DeepSpeed rank of a session: about 40 s of CPU), into
$TORCH_EXTENSIONS_DIR. scripts/test.sh runs it in the background while lint, Chromium and the test
clusters start, which leave a core idle; the ranks then load the build (torch's extension loader
takes a lock, so a rank that starts meanwhile waits for this build instead of starting another).

    .venv/bin/python -m tests.support.warm_builds
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> int:
    if not os.environ.get("TORCH_EXTENSIONS_DIR"):
        print("warm_builds: TORCH_EXTENSIONS_DIR is not set; nothing built", file=sys.stderr)
        return 2
    started = time.monotonic()
    # The ranks' PATH (tests/conftest.py puts the interpreter's folder first): torch runs whichever
    # `ninja` comes first, and ninja 1.13 (in .venv) and 1.11 (the system's) log a command under
    # different hashes, so each rebuilt what the other had built.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    try:
        from deepspeed.comm.torch import build_shm_op
    except ImportError:
        print("warm_builds: deepspeed is not installed; nothing built")
        return 0
    built = build_shm_op()
    print(
        f"warm_builds: deepspeed_shm_comm {'ready' if built else 'not needed here'} in {time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
