"""The HTTP API: FastAPI routers for users and sessions, the OpenAI-compatible front door,
API-key auth and one error mapping. ``companion serve`` runs :func:`create_app` under uvicorn."""

from runtime.service.api.app import create_app
from runtime.service.api.errors import ERRORS, error_body, status_and_code

__all__ = ["ERRORS", "create_app", "error_body", "status_and_code"]
