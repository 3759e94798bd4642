"""What runs in a parse subprocess: resource limits, then one parse.

:func:`limit_child` is the pool's initializer: it caps the process's CPU time
(``RLIMIT_CPU``: the kernel stops it with SIGXCPU, then SIGKILL) and its address space
(``RLIMIT_AS``: an allocation past it raises ``MemoryError``), and lowers its priority
(``nice`` +10) so parses yield the CPU to the service's own requests. :func:`parse_in_child`
answers with plain, picklable values: our exceptions carry keyword arguments that do not
survive pickling.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from errors import FileParseError
from runtime.parsing import Extract, ParseLimits, parse_document

NICE_INCREMENT = 10
"""How much lower a parse runs than the service (``os.nice``)."""


def limit_child(cpu_seconds: float | None, memory_bytes: int | None) -> None:
    """Cap this process: ``cpu_seconds`` of CPU time, ``memory_bytes`` of address space (``None``: no cap)."""
    if cpu_seconds is not None:
        soft = max(1, int(cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 2))
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    try:
        os.nice(NICE_INCREMENT)
    except OSError:  # not allowed here: run at the same priority
        pass


def parse_in_child(data: bytes, name: str, mime: str | None, limits: ParseLimits) -> tuple[str, Any, Any]:
    """``("ok", extract, None)``, or ``("failed", message, reason)`` for a FileParseError or a
    parse that ran out of memory (reason ``too_large``)."""
    try:
        extract: Extract = parse_document(data, name=name, mime=mime, limits=limits)
        return ("ok", extract, None)
    except FileParseError as exc:
        return ("failed", str(exc), exc.reason)
    except MemoryError:
        return ("failed", f"{name}: parsing it needed more memory than one parse may use; not parsed.", "too_large")
