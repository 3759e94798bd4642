"""Importing the runtime changes nothing: ``os.environ`` is the same before and after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import importlib, json, os, pkgutil, sys
before = dict(os.environ)
import runtime
names = sorted(m.name for m in pkgutil.walk_packages(runtime.__path__, "runtime.") if not m.name.endswith("__main__"))
for name in names:
    importlib.import_module(name)
after = dict(os.environ)
changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
print(json.dumps({"modules": names, "changed": changed, "litellm": "litellm" in sys.modules}))
"""


def test_importing_runtime_and_every_subpackage_leaves_the_environment_alone():
    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_LOCAL_MODEL_COST_MAP", "TIKTOKEN_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"runtime.llm", "runtime.accounting", "runtime.compaction", "runtime.cli", "runtime.service"} <= set(
        result["modules"]
    )
    assert result["changed"] == []


def test_the_offline_defaults_are_filled_when_litellm_is_first_loaded():
    env = {k: v for k, v in os.environ.items() if k not in ("LITELLM_LOCAL_MODEL_COST_MAP", "TIKTOKEN_CACHE_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    probe = (
        "import os; from runtime._offline import load_tiktoken; load_tiktoken(); "
        "print(os.environ['LITELLM_LOCAL_MODEL_COST_MAP'], os.path.isdir(os.environ['TIKTOKEN_CACHE_DIR']))"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]
