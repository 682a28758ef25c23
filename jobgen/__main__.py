"""`python -m jobgen`: the jobgen command (a job's batch script runs `python -m jobgen top-up` with the
interpreter that submitted it, where `jobgen` may not be on PATH)."""

from jobgen.cli import entry

entry()
