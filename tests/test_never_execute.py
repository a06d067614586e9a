"""Guard: the package never executes checkpoint or user content.

No torch.load / pickle.load(s) / Unpickler (under any alias), no yaml.load (safe_load only), no
eval/exec/__import__, no shell=True, and every Jinja2 environment uses StrictUndefined. The guard
itself is tested on snippets that break each rule (the same function checks the package).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "scripts" / "checkpoint_strategy"
FILES = sorted(PKG.rglob("*.py"))
_PICKLE = {"load", "loads", "Unpickler"}
FORBIDDEN = {
    "pickle": _PICKLE,
    "_pickle": _PICKLE,
    "cPickle": _PICKLE,
    "dill": _PICKLE,
    "cloudpickle": _PICKLE,
    "marshal": {"load", "loads"},
    "shelve": {"open"},
    "torch": {"load"},
    "joblib": {"load"},
    "numpy": {"load"},
    "yaml": {
        "load",
        "load_all",
        "unsafe_load",
        "unsafe_load_all",
        "full_load",
        "full_load_all",
        "Loader",
        "UnsafeLoader",
        "FullLoader",
    },
}
BUILTINS = {"eval", "exec", "__import__"}
# Reviewed exceptions, (file, call): the Jinja2 bytecode cache of this package's own templates, read only from a
# folder that is the user's own and not writable by others (render.py, docs/DEVELOPING.md); never user content.
# The one pickle reader: the C unpickler subclassed with a find_class that returns the module's own inert records
# and a persistent_load (formats/safepickle.py; tests/test_safepickle.py feeds it a payload on every path).
ALLOWED = {("render.py", "marshal.loads"), ("formats/safepickle.py", "pickle.Unpickler")}


def violations(source: str, where: str = "<snippet>") -> list[str]:
    """Every way `source` could execute checkpoint or user content, one line each."""
    tree = ast.parse(source)
    alias: dict[str, str] = {}  # local name -> module (import pickle as p; import numpy as np)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                alias[a.asname or root] = a.name if a.asname else root
        elif isinstance(node, ast.ImportFrom) and node.module:
            bad = {a.name for a in node.names} & FORBIDDEN.get(node.module, set())
            if bad:
                found.append(
                    f"{where}:{node.lineno}: from {node.module} import {', '.join(sorted(bad))}"
                )
            for a in (
                node.names
            ):  # from torch import serialization as s; s.load(...) is not followed (rare)
                if f"{node.module}.{a.name}" in FORBIDDEN or a.name in FORBIDDEN:
                    alias[a.asname or a.name] = (
                        a.name if a.name in FORBIDDEN else f"{node.module}.{a.name}"
                    )
    found += _unpickler_subclasses(tree, alias, where)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        line = f"{where}:{node.lineno}"
        safe_import = (
            isinstance(f, ast.Name)
            and f.id == "__import__"
            and isinstance(_constant(node, 0), str)
            and _constant(node, 0).split(".")[0] not in FORBIDDEN
        )  # __import__("re")
        if isinstance(f, ast.Name) and f.id in BUILTINS and not safe_import:
            found.append(f"{line}: {f.id}()")
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            module = alias.get(f.value.id, f.value.id)
            if f.attr in FORBIDDEN.get(module, ()) and (where, f"{module}.{f.attr}") not in ALLOWED:
                found.append(f"{line}: {module}.{f.attr}() (as {f.value.id}.{f.attr})")
            if (
                module == "importlib"
                and f.attr == "import_module"
                and _constant(node, 0) in FORBIDDEN
            ):
                found.append(f"{line}: importlib.import_module({_constant(node, 0)!r})")
            if module == "builtins" and f.attr in BUILTINS:
                found.append(f"{line}: builtins.{f.attr}()")
        if (
            isinstance(f, ast.Name)
            and f.id == "getattr"
            and node.args
            and isinstance(node.args[0], ast.Name)
        ):
            module = alias.get(node.args[0].id, node.args[0].id)
            if _constant(node, 1) in FORBIDDEN.get(module, ()) or (
                module == "builtins" and _constant(node, 1) in BUILTINS
            ):
                found.append(f"{line}: getattr({module}, {_constant(node, 1)!r})")
        for kw in node.keywords:
            if kw.arg == "shell" and not (
                isinstance(kw.value, ast.Constant) and not kw.value.value
            ):
                found.append(f"{line}: shell={ast.unparse(kw.value)}")
            if kw.arg == "Loader" and module_of(kw.value, alias) != "yaml.SafeLoader":
                found.append(f"{line}: Loader={ast.unparse(kw.value)}")
    return found


def _unpickler_subclasses(tree: ast.AST, alias: dict[str, str], where: str) -> list[str]:
    """A class built on an unpickler runs whatever its find_class resolves: allowed only where reviewed, and there
    only with its own find_class and persistent_load."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for base in node.bases:
            name = module_of(base, alias)
            if name.split(".")[0] in FORBIDDEN and name.rsplit(".", 1)[-1] in (
                "Unpickler",
                "_Unpickler",
            ):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if (where, "pickle.Unpickler") not in ALLOWED or not {
                    "find_class",
                    "persistent_load",
                } <= methods:
                    found.append(f"{where}:{node.lineno}: class {node.name}({name})")
    return found


def _constant(call: ast.Call, i: int):
    return (
        call.args[i].value
        if len(call.args) > i and isinstance(call.args[i], ast.Constant)
        else None
    )


def module_of(node: ast.AST, alias: dict[str, str]) -> str:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{alias.get(node.value.id, node.value.id)}.{node.attr}"
    return ast.unparse(node)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_code_execution_paths(path):
    assert violations(path.read_text(encoding="utf-8"), str(path.relative_to(PKG))) == []


def test_the_reviewed_unpickler_needs_its_own_find_class():
    body = "import pickle\nclass R(pickle.Unpickler):\n    def find_class(self, m, n): return 1\n"
    assert violations(body, "formats/safepickle.py")  # without persistent_load
    assert not violations(
        body + "    def persistent_load(self, pid): return 1\n", "formats/safepickle.py"
    )
    assert violations(body + "    def persistent_load(self, pid): return 1\n", "elsewhere.py")


def test_jinja_environments_are_strict():
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        if "jinja2.Environment(" in text or "Environment(" in text and "jinja2" in text:
            assert "StrictUndefined" in text, path


@pytest.mark.parametrize(
    "snippet",
    [
        "import torch\ntorch.load(p)",
        "import torch as t\nt.load(p)",
        "import pickle\npickle.loads(b'')",
        "import pickle as p\np.loads(b'')",
        "import _pickle as cp\ncp.Unpickler(f).load()",
        "from pickle import loads\nloads(b'')",
        "from pickle import loads as harmless\nharmless(b'')",
        "from torch import load",
        "import numpy as np\nnp.load(p, allow_pickle=True)",
        "import dill\ndill.load(f)",
        "import marshal as m\nm.loads(b'')",
        "import yaml\nyaml.load(s)",
        "import yaml as y\ny.unsafe_load(s)",
        "import yaml\nyaml.load_all(s, Loader=yaml.UnsafeLoader)",
        "import yaml\nyaml.safe_load(s, Loader=yaml.FullLoader)",
        "eval('1')",
        "exec('x = 1')",
        "__import__('pickle').loads(b'')",
        "import builtins\nbuiltins.eval('1')",
        "import pickle\ngetattr(pickle, 'loads')(b'')",
        "import importlib\nimportlib.import_module('pickle')",
        "import subprocess\nsubprocess.run(cmd, shell=True)",
        "import subprocess\nsubprocess.run(cmd, shell=flag)",
        "import pickle\nclass R(pickle.Unpickler):\n    pass",
        "import pickle as p\nclass R(p._Unpickler):\n    def find_class(self, m, n): return 1",
    ],
)
def test_the_guard_catches_each_forbidden_form(snippet):
    assert len(violations(snippet)) >= 1, snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "import pickletools\nlist(pickletools.genops(data))",
        "import yaml\nyaml.safe_load(s)",
        "import json\njson.loads(s)",
        "import re\nre.compile('x')",
        "import subprocess\nsubprocess.run(cmd, shell=False)",
        "_RE = __import__('re').compile('x')",
        "import numpy as np\nnp.loadtxt(p)",
    ],
)
def test_the_guard_lets_safe_calls_through(snippet):
    assert violations(snippet) == []
