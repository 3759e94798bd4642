"""runtime.cli"""

from runtime.cli._main import main

__all__ = ["main"]
