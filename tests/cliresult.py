"""The one way tests run the command line in-process: `cli_run(*argv, stdin=None) -> Result`.

`Result` unpacks like the old (rc, out, err) tuples; `.json()` parses stdout (and fails with the
streams when the command did not print JSON); `.usage_error()` asserts the bad-input contract
(exit 2, nothing on stdout, exactly one stderr line with the one error prefix) and returns that line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, Optional, Union

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
    clean: Union[None, Path, Sequence[Path]] = None,
    timeout: float = 600,
    remake: bool = False,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """Run a real framework job that makes a test's inputs; return the attempt that exited 0 (its stdout, stderr),
    raise RuntimeError with its stderr when it fails. The one failure tried again (up to JOB_ATTEMPTS in all, after
    removing `clean`: a folder or several) is gloo's teardown abort, and only that one: any other failure, and the
    abort every time, fail the test with every attempt's stderr. The job runs in a session of its own: past
    `timeout` every process of it (torchrun's ranks too) is killed before TimeoutExpired is raised, so a hung job
    leaves no rank behind to load the machine for the tests after it. remake: each `clean` folder is made again,
    empty, after its removal (a job that writes into a folder it does not make itself: a Trainer's output_dir)."""
    import shutil

    errors = []
    for _ in range(JOB_ATTEMPTS):
        proc = run_once(argv, timeout, env, **kw)
        if proc.returncode == 0:
            return proc
        errors.append(f"{what} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        if TEARDOWN_ABORT not in proc.stderr:
            break
        for folder in [clean] if isinstance(clean, Path) else clean or ():
            shutil.rmtree(folder, ignore_errors=True)
            if remake:
                folder.mkdir(parents=True)
    raise RuntimeError("\n--- then ---\n".join(errors))


def two_rank_launch(
    program: str, args: list[str], torchrun: bool
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a 2-process run of `program args` on gloo: under torchrun --standalone (it
    binds its store's port itself), else the program alone (it starts rank 1 itself, as Lightning does, picking its
    port as it starts it): no port is picked here and bound later."""
    env = checkout_env(
        MASTER_ADDR="127.0.0.1",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("MASTER_PORT", None)
    argv = [program, *args]
    if torchrun:
        argv = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *argv]
    return [sys.executable, *argv], env


def two_ranks(
    program: str,
    args: list[str],
    out: Path,
    what: str,
    torchrun: bool,
    timeout: float,
    clean: bool = True,
) -> tuple[dict, dict, str]:
    """A 2-process run of `program args` on gloo (torchrun --standalone when `torchrun`: it binds its store's port
    itself; else the program starts rank 1 itself, as Lightning does, picking its port as it starts it: no port is
    picked here and bound later), through run_job (must exit 0: its ranks end with end_job; tried again only after
    gloo's teardown abort, from an emptied `out` when `clean`); a hang or a failure fails the test. Each rank's
    out/result-<rank>.json, and the run's output (HF's ranks print the package's lines to stdout)."""
    import pytest

    argv, env = two_rank_launch(program, args, torchrun)
    try:
        res = run_job(argv, what, env, out if clean else None, timeout, True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} did not end within {timeout} s: {str(exc.stderr)[-3000:]}")
    except RuntimeError as exc:
        pytest.fail(str(exc)[-6000:])
    r0, r1 = (json.loads((out / f"result-{r}.json").read_text()) for r in (0, 1))
    return r0, r1, res.stdout + res.stderr


def run_once(
    argv: list[str], timeout: float, env: dict[str, str], **kw: Any
) -> subprocess.CompletedProcess[str]:
    """subprocess.run(argv) in a session of its own, its output captured (text); past `timeout` every process of the
    session is ended (_end_session), then TimeoutExpired is raised with what it printed."""
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        **kw,
    ) as popen:
        try:
            out, err = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _end_session(popen)
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, popen.returncode, out, err)


def _end_session(popen: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM to the job's session (torchrun's agent then stops its ranks, which it started in sessions of their
    own), SIGKILL to what is left of it 30 s later; what the job printed (what it had printed 30 s after that, when
    a process outside the session still holds its pipes)."""
    import signal

    waited = None
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, sig)
        try:
            return popen.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:
            waited = exc
    assert waited is not None
    out, err = (
        x.decode(errors="replace") if isinstance(x, bytes) else x or ""
        for x in (waited.stdout, waited.stderr)
    )
    return out, err


def write_atomic(path: Path, text: str) -> None:
    """A job's result file, written temp-then-rename: a reader sees all of it or nothing."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def end_job(results: Optional[dict[Path, str]] = None) -> NoReturn:
    """The end of a real multi-process job whose work is on disk: write `results` (path -> text, write_atomic),
    meet the other ranks (when a process group is up: no rank leaves while another still talks to it), flush
    stdout and stderr, and leave with os._exit(0). No process-group teardown is left for gloo to abort in
    ('terminate called without an active exception', TEARDOWN_ABORT, met under load after the work was done,
    after destroy_process_group too). Atexit handlers do not run: a job that needs one calls it first."""
    for path, text in (results or {}).items():
        write_atomic(path, text)
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return Result(rc, out.getvalue(), err.getvalue())


def shipped_copy(dest: Path) -> Path:
    """Copy what the repository ships (``git ls-files``: committed files only, no build output, no test
    fixture made at run time) into `dest`, as a fresh clone would have it. Skips when this checkout is not a
    git work tree (an unpacked sdist)."""
    import shutil

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
