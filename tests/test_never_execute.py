"""Guard: the package never executes checkpoint or user content.

No torch.load / pickle.load(s) / Unpickler, no yaml.load (safe_load only), no eval/exec, no
shell=True, and every Jinja2 environment uses StrictUndefined.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "scripts" / "checkpoint_strategy"
FILES = sorted(PKG.rglob("*.py"))
FORBIDDEN_ATTRS = {("torch", "load"), ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"),
                   ("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("dill", "load"),
                   ("joblib", "load"), ("numpy", "load"), ("np", "load")}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_code_execution_paths(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "torch", "dill", "joblib"):
            names = {a.name for a in node.names}
            assert not names & {"load", "loads", "Unpickler"}, f"{path}: from {node.module} import {names}"
    for call in _calls(tree):
        f = call.func
        if isinstance(f, ast.Name):
            assert f.id not in ("eval", "exec"), f"{path}:{call.lineno}: {f.id}()"
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            assert (f.value.id, f.attr) not in FORBIDDEN_ATTRS, f"{path}:{call.lineno}: {f.value.id}.{f.attr}()"
        for kw in call.keywords:
            if kw.arg == "shell":
                assert not (isinstance(kw.value, ast.Constant) and kw.value.value), f"{path}:{call.lineno}: shell=True"


def test_jinja_environments_are_strict():
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        if "jinja2.Environment(" in text or "Environment(" in text and "jinja2" in text:
            assert "StrictUndefined" in text, path


def test_the_guard_catches_a_forbidden_call(tmp_path):
    bad = "import pickle\nimport torch\ndef f(p):\n    return torch.load(p), pickle.loads(b'')\n"
    tree = ast.parse(bad)
    hits = [c for c in _calls(tree) if isinstance(c.func, ast.Attribute)
            and (c.func.value.id, c.func.attr) in FORBIDDEN_ATTRS]
    assert len(hits) == 2
