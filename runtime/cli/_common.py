"""Shared pieces of the command line: settings and logging, argument checks, the exit status."""

from __future__ import annotations

import argparse

EXIT_USAGE = 2
"""Exit status for an error of the input, not-found, conflict and configuration branches: fix the
command, its arguments or its settings."""
EXIT_UNAVAILABLE = 69
"""Exit status when a dependency (database, model provider, summarizer) failed: sysexits.h's
``EX_UNAVAILABLE``; the same command may succeed later."""
EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C: 128 + SIGINT, as a shell reports a process SIGINT ended."""


def exit_status(exc: BaseException) -> int:
    """The exit status of a command that failed with ``exc``, by its branch of :mod:`errors`."""
    from errors import DependencyError

    return EXIT_UNAVAILABLE if isinstance(exc, DependencyError) else EXIT_USAGE


def _settings(*, database: bool = False):
    """The settings, with logging configured. ``database=True`` for a command that opens the
    database next: without ``DATABASE_URL`` the embedded server's start begins now on a thread
    (:func:`memory.embedded.start_embedded_soon`), while the command imports the rest."""
    from runtime.config import Settings
    from runtime.logs import configure_logging

    settings = Settings.from_env()
    configure_logging(settings.log_level, settings.log_format)
    if database and not settings.database_url:
        from memory.embedded import start_embedded_soon

        start_embedded_soon(settings.data_dir)
    return settings


def _check_window(window: int | None) -> None:
    """Refuse a ``--window`` the budgets cannot scale to (:class:`~errors.ConfigurationError`),
    before the command starts the database; ``None`` passes."""
    if window is not None:
        from runtime.accounting import Budgets

        Budgets.create().scaled_to(window)


def _id_arg(value: str) -> str:
    """argparse type for a user, session or persona id: 1-200 printable characters
    (the same rule as the HTTP API, :func:`memory.validation.check_name`)."""
    from errors import InvalidRequestError
    from memory.validation import check_name

    try:
        return check_name(value, field="id")
    except InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None


def _port_arg(value: str) -> int:
    """argparse type for a TCP port: 0 (any free port) to 65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0-65535")
    return port


def _hours_arg(value: str) -> float:
    """argparse type for a non-negative number of hours."""
    try:
        hours = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of hours") from None
    if not hours >= 0 or hours == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: the idle threshold must be 0 or more hours")
    return hours
