"""The one way tests run the command line in-process: `cli_run(*argv, stdin=None) -> Result`.

`Result` unpacks like the old (rc, out, err) tuples; `.json()` parses stdout (and fails with the
streams when the command did not print JSON); `.usage_error()` asserts the bad-input contract
(exit 2, nothing on stdout, exactly one stderr line with the one error prefix) and returns that line.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

from checkpoint_strategy.cli.main import ERROR_PREFIX, main

# The checkout under test. A subprocess runs *it*, never whichever copy is installed or first on PATH:
# CLI is the module entry point of the running interpreter, checkout_env() puts this checkout's scripts/ first on
# PYTHONPATH and the running interpreter's folder (its console scripts: agentskills, ...) first on PATH.
# Under mutation testing (bench/mutation.py) the package under test is the mutated copy mutmut imports, not scripts/:
# CHECKPOINT_STRATEGY_TEST_SOURCE names its folder, so a subprocess runs the mutant too.
SCRIPTS = Path(
    os.environ.get("CHECKPOINT_STRATEGY_TEST_SOURCE")
    or Path(__file__).resolve().parent.parent / "scripts"
)
CLI = [sys.executable, "-m", "checkpoint_strategy"]
BIN = Path(sys.executable).parent


def checkout_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS), *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env.update(extra)
    return env


# gloo's teardown can abort a process whose work is done ("terminate called without an active exception": a C++
# thread still joinable when the process exits; seen once in CI on FSDP2 under mp.spawn, never on an idle run here).
TEARDOWN_ABORT = "terminate called without an active exception"
#: a loaded CI run saw the abort twice in a row for one job (2026-12-06): three attempts in all
JOB_ATTEMPTS = 3


def run_job(
    argv: list[str],
    what: str,
    env: dict[str, str],
    clean: Optional[Path] = None,
    timeout: float = 600,
    **kw: Any,
) -> None:
    """Run a real framework job that makes a test's inputs; raise RuntimeError with its stderr when it fails.
    The one failure tried again (up to JOB_ATTEMPTS in all, after removing `clean`) is gloo's teardown abort, and
    only that one: any other failure, and the abort every time, fail the test with every attempt's stderr."""
    import shutil
    import subprocess

    errors = []
    for _ in range(JOB_ATTEMPTS):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kw)
        if proc.returncode == 0:
            return
        errors.append(f"{what} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        if TEARDOWN_ABORT not in proc.stderr:
            break
        if clean is not None:
            shutil.rmtree(clean, ignore_errors=True)
    raise RuntimeError("\n--- then ---\n".join(errors))


class Result(NamedTuple):
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.rc in (0, 1), f"exit {self.rc}: {self.err}"
        try:
            return json.loads(self.out)
        except ValueError:
            raise AssertionError(
                f"stdout is not JSON (exit {self.rc}): {self.out[:500]!r} {self.err!r}"
            ) from None

    def usage_error(self, match: str = "") -> str:
        assert self.rc == 2, f"expected exit 2, got {self.rc}: {self.out[:300]!r} {self.err!r}"
        assert self.out == "", self.out
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in self.err, self.err
        assert lines[0].startswith(ERROR_PREFIX), lines[0]
        assert match.lower() in lines[0].lower(), lines[0]
        return lines[0]


def invoke(capsys, monkeypatch, argv, stdin: Optional[str] = None) -> Result:
    capsys.readouterr()  # drop whatever a fixture (the Trainer) printed before
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8"))))
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return Result(rc, out, err)


def run_captured(argv) -> Result:
    """For hypothesis tests (no function-scoped fixtures): the same Result, streams captured here."""
    import contextlib

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return Result(rc, out.getvalue(), err.getvalue())


def shipped_copy(dest: Path) -> Path:
    """Copy what the repository ships (``git ls-files``: committed files only, no build output, no test
    fixture made at run time) into `dest`, as a fresh clone would have it. Skips when this checkout is not a
    git work tree (an unpacked sdist)."""
    import shutil
    import subprocess

    import pytest

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z"],
        capture_output=True,
        timeout=60,
        env=checkout_env(),
    )
    if proc.returncode != 0:
        pytest.skip(f"{root} is not a git work tree: cannot tell what the repository ships")
    for rel in filter(None, proc.stdout.decode().split("\0")):
        src = root / rel
        if not os.path.lexists(src):  # deleted in the work tree, not yet committed
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    return dest
