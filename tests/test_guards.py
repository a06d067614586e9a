"""Conventions the code guards itself (ruff and mypy run in .ci/run; this covers what they do not)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "scripts" / "checkpoint_strategy"
MAX_LINES = 60
# Functions known to be longer, to be split (issue 10); the list may only shrink. Argparse tables
# (add_arguments, add_*_options) are exempt: one option per line reads better than helpers.
LONG_FUNCTION_DEBT: set[str] = set()  # all split (issue 10); keep it empty


def functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield (
                    f"{path.relative_to(PACKAGE).as_posix()}:{node.name}",
                    node.end_lineno - node.lineno + 1,
                )


def test_no_new_function_over_60_lines():
    long = {name for name, lines in functions() if lines > MAX_LINES}
    exempt = {
        n for n in long if n.split(":")[1] == "add_arguments" or n.split(":")[1].startswith("add_")
    }
    assert long - exempt <= LONG_FUNCTION_DEBT, (
        f"functions over {MAX_LINES} lines: {sorted(long - exempt - LONG_FUNCTION_DEBT)}"
    )


def test_no_private_copy_of_the_shared_helpers():
    """One storage layer, one output path: commands do not open files or pick templates themselves."""
    paths = sorted(
        p for p in (PACKAGE / "cli").glob("*.py") if p.name not in ("__init__.py", "main.py")
    )
    assert len(paths) >= 12  # every command module
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for banned in (
            "render_template(",
            "to_json(",
            "sys.stdout.write(",
            'choices=("text"',
            'choices=["text"',
        ):
            if path.name == "export.py" and banned.startswith("choices="):
                continue  # export's --format names framework settings files (python, toml, args) besides the reports
            assert banned not in text, (
                f"{path.name}: use render.emit / cli.options.add_report_options, not {banned}"
            )


TESTS = Path(__file__).resolve().parent
SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call"}


def test_every_subprocess_in_the_tests_runs_this_checkout():
    """A child process gets an explicit environment (cliresult.checkout_env: this checkout's scripts/ first on
    PYTHONPATH, this interpreter's folder first on PATH), and no program is looked up by name on PATH: from a
    second checkout, or with another copy installed, the suite still tests the code it sits next to."""
    bad = []
    for path in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = (
                f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            )
            owner = (
                f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            )
            where = f"{path.name}:{node.lineno}"
            if (
                owner == "subprocess"
                and name in SUBPROCESS_CALLS
                and not any(k.arg == "env" for k in node.keywords)
            ):
                bad.append(f"{where} subprocess.{name} without env=")
            if (
                owner == "shutil"
                and name == "which"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value
                in ("checkpoint-strategy", "agentskills", "python", "python3")
            ):
                bad.append(f"{where} shutil.which({node.args[0].value!r})")
            if (
                owner == "subprocess"
                and node.args
                and isinstance(node.args[0], ast.List)
                and node.args[0].elts
                and isinstance(node.args[0].elts[0], ast.Constant)
                and node.args[0].elts[0].value
                in ("checkpoint-strategy", "agentskills", "python", "python3")
            ):
                bad.append(f"{where} runs {node.args[0].elts[0].value!r} from PATH")
    assert bad == []


def test_the_package_under_test_is_this_checkout():
    from cliresult import SCRIPTS, checkout_env

    import checkpoint_strategy

    assert Path(checkpoint_strategy.__file__).resolve().is_relative_to(SCRIPTS), (
        checkpoint_strategy.__file__
    )
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import checkpoint_strategy; print(checkpoint_strategy.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        env=checkout_env(),
        cwd="/",
    ).stdout.strip()
    assert Path(out).resolve().is_relative_to(SCRIPTS), out
