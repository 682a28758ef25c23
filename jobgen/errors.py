"""The one tree of errors a user can cause. Each message is one line that says what to do next."""

from __future__ import annotations

import click


class JobgenError(click.ClickException):
    """Base of every error jobgen reports to a user (exit code 1, one line, no traceback)."""

    exit_code = 1


class ConfigError(JobgenError):
    """The experiment file is unreadable or invalid."""


class PlanError(JobgenError):
    """The experiment is valid on its own, but a job (or sweep point) cannot work."""


class TemplateError(JobgenError):
    """A template is missing or does not render."""


class RunNotFound(JobgenError):
    """No run directory matches what the user named."""


class SubmitError(JobgenError):
    """The scheduler refused a job, or could not be reached."""


class BackendError(JobgenError):
    """A backend's tool (sbatch, squeue, submitit, ...) is missing or failed."""
