"""The package layering holds: pure packages import no storage, storage imports no runtime,
and only the top (service, cli) imports the top. Checked both ways: every import statement in
the source (direct), and what importing the package actually loads (transitive)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def imported_modules(package: str) -> dict[str, set[str]]:
    """File -> the absolute module names its import statements name (at any depth of the file)."""
    out: dict[str, set[str]] = {}
    base = REPO / package.replace(".", "/")
    paths = sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]
    for path in paths:
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(path.relative_to(REPO))] = names
    return out


def offending(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{file}: {name}"
        for file, names in imported_modules(package).items()
        for name in names
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    )


RULES = [
    pytest.param(
        "runtime.accounting",
        ("memory", "runtime.turn", "runtime.service", "runtime.cli", "runtime.llm", "runtime.context"),
        id="accounting-pure",
    ),
    pytest.param(
        "runtime.context",
        ("memory", "runtime.turn", "runtime.service", "runtime.cli", "runtime.files", "runtime.compaction"),
        id="context-pure",
    ),
    pytest.param("persona", ("memory", "runtime"), id="persona-pure"),
    pytest.param("runtime.parsing", ("runtime.turn", "runtime.service", "runtime.cli"), id="parsing-below-turn"),
    pytest.param("memory", ("runtime", "persona"), id="memory-below-runtime"),
    pytest.param("errors", ("memory", "runtime", "persona", "prompts"), id="errors-at-the-bottom"),
    pytest.param(
        "runtime.messages",
        ("memory", "runtime.accounting", "runtime.context", "runtime.llm", "runtime.turn"),
        id="messages-at-the-bottom",
    ),
    pytest.param("runtime.summary_items", ("memory", "runtime", "persona"), id="summary-items-at-the-bottom"),
    pytest.param("runtime.llm", ("memory", "runtime.turn", "runtime.service", "runtime.cli"), id="llm-boundary"),
    pytest.param("runtime.compaction", ("runtime.turn", "runtime.service", "runtime.cli"), id="compaction-below-turn"),
    pytest.param("runtime.files", ("runtime.turn", "runtime.service", "runtime.cli"), id="files-below-turn"),
    pytest.param("runtime.turn", ("runtime.service", "runtime.cli"), id="turn-below-service"),
]


@pytest.mark.parametrize(("package", "forbidden"), RULES)
def test_package_imports_nothing_from_the_layers_it_must_not_know(package, forbidden):
    assert offending(package, forbidden) == []


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        pytest.param("runtime.accounting", "memory", id="accounting"),
        pytest.param("runtime.context", "memory", id="context"),
        pytest.param("persona", "memory", id="persona"),
        pytest.param("memory", "runtime", id="memory"),
    ],
)
def test_importing_a_pure_package_loads_no_storage(package, forbidden):
    code = (
        f"import sys, {package}; "
        f"bad = sorted(m for m in sys.modules if m == {forbidden!r} or m.startswith({forbidden!r} + '.')); "
        "print(','.join(bad))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_every_package_exports_its_public_names():
    for init in sorted(REPO.glob("runtime/*/__init__.py")) + [
        REPO / "persona/__init__.py",
        REPO / "memory/__init__.py",
    ]:
        tree = ast.parse(init.read_text(encoding="utf-8"))
        exported = [
            n
            for n in tree.body
            if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
        ]
        if init.parent.name in ("memory",):
            continue  # storage modules are imported by module (memory.store, memory.recall, ...)
        assert exported, f"{init.relative_to(REPO)} has no __all__"


OUTSIDE_STORAGE = ("runtime", "persona", "prompts")
DATABASE_CALLS = {"execute", "exec", "begin", "scalars", "scalar", "exec_driver_sql"}


def _python_files(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (REPO / package).rglob("*.py"))


def test_sql_lives_in_the_storage_rooms_only():
    """Outside ``memory/`` no code runs a statement, opens a transaction, builds SQL text or
    reaches through a store to its engine: every table's SQL has one owner in ``memory/``."""
    found = []
    for path in _python_files(*OUTSIDE_STORAGE):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in DATABASE_CALLS:
                    found.append(f"{where}: .{node.func.attr}(...)")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] in ("sqlalchemy", "sqlmodel")
            ):
                names = {alias.name for alias in node.names}
                if names - {"Engine"}:  # the engine's type, for wiring, is all a caller may name
                    found.append(f"{where}: from {node.module} import {sorted(names - {'Engine'})}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "engine"
                and isinstance(node.value, (ast.Name, ast.Attribute))
                and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr) == "store"
            ):
                found.append(f"{where}: store.engine")
    assert found == []


MODULE_LINES = 600
"""A module of product code stays under this many lines, unless it is one of the few below."""
LARGE_MODULES: dict[str, int] = {}
"""Modules over :data:`MODULE_LINES`, each with its current size: they may only shrink."""

PARAMETERS = 10
"""A product function takes at most this many parameters besides ``self``/``cls``; more travel
as a value object."""
MANY_PARAMETERS: dict[str, int] = {}
"""Functions over :data:`PARAMETERS`, each with its current count: they may only lose some."""

PRODUCT = ("memory", "runtime", "persona", "prompts", "errors.py")


def _product_files() -> list[Path]:
    return sorted(
        p
        for name in PRODUCT
        for p in ((REPO / name).rglob("*.py") if (REPO / name).is_dir() else [REPO / name])
        if p.exists()
    )


def test_product_modules_stay_small():
    sizes = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines()) for p in _product_files()}
    over = {name: n for name, n in sizes.items() if n > LARGE_MODULES.get(name, MODULE_LINES)}
    assert over == {}


def test_product_functions_take_few_parameters():
    over = {}
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                count = len([n for n in names if n not in ("self", "cls")])
                key = f"{path.relative_to(REPO)}:{node.name}"
                if count > MANY_PARAMETERS.get(key, PARAMETERS):
                    over[key] = count
    assert over == {}
