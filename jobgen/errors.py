"""The one tree of errors a user can cause. Each message is one line that says what to do next."""

from __future__ import annotations

import unicodedata

import click


def is_control(char: str) -> bool:
    """Control characters (newline, carriage return, NUL, escape, ...) and Unicode's line and paragraph
    separators: none belongs in a name, a script line or a one-line message."""
    return unicodedata.category(char) in ("Cc", "Zl", "Zp")


def one_line(text: str) -> str:
    """The text with control characters written as escapes: a file or key name with a newline in it
    (or any other control character) must not break a message over lines, or into the terminal."""
    if text.isprintable() or not any(is_control(c) for c in text):
        return text
    return "".join(c.encode("unicode_escape").decode("ascii") if is_control(c) else c for c in text)


class JobgenError(click.ClickException):
    """Base of every error jobgen reports to a user (exit code 1, one line, no traceback)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class ConfigError(JobgenError):
    """The experiment file is unreadable or invalid."""


class BadUsage(JobgenError):
    """A command line the library finds malformed (a `--set` item that is not KEY=VALUE): a usage error,
    exit 2 as click's own, but in one line like every other error."""

    exit_code = 2


class PlanError(JobgenError):
    """The experiment is valid on its own, but a job (or sweep point) cannot work."""


class TemplateError(JobgenError):
    """A template is missing or does not render."""


class RunNotFound(JobgenError):
    """No run directory matches what the user named."""


class DriftError(JobgenError):
    """A run cannot be repeated as it was recorded (`jobgen rerun`): its code snapshot is missing, a package
    has another version where the jobs would run, ... `drift` holds one line per difference."""

    def __init__(self, message: str, drift: list[str]) -> None:
        super().__init__(message)
        self.drift = drift


class WaitTimeout(JobgenError, TimeoutError):
    """Jobs were still running when a wait for them (`status --watch --timeout`, `Run.wait`) gave up."""


class BadArgument(JobgenError, TypeError):
    """A function of jobgen.api was called with a value of the wrong type (or shape)."""


class SubmitError(JobgenError):
    """The scheduler refused a job, or could not be reached.

    `maybe_queued` is False only when the scheduler answered with a refusal: after a timeout, a lost or
    garbled reply, the job may be queued all the same.
    """

    def __init__(self, message: str, maybe_queued: bool = True) -> None:
        super().__init__(message)
        self.maybe_queued = maybe_queued


class BackendError(JobgenError):
    """A backend's tool (sbatch, squeue, submitit, ...) is missing or failed."""
