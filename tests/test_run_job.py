"""tests/cliresult.run_job: the helper that runs the real framework jobs behind the fixtures tries again only on
gloo's teardown abort, and fails with every attempt's stderr otherwise; run_once ends a timed-out job's whole
session; end_job writes a job's results whole and leaves."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cliresult import SCRIPTS, TEARDOWN_ABORT, checkout_env, run_job, run_once

# fails when the last attempt's output was not removed; exits 134 with `message` on stderr while the counter file holds fewer than `fails` marks, then succeeds
JOB = """
import sys
from pathlib import Path
counter, fails, message = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
n = len(counter.read_text()) if counter.exists() else 0
counter.write_text("x" * (n + 1))
out = Path(sys.argv[4])
if (out / "part").exists():
    sys.exit("the last attempt's half-written output is still there")
out.mkdir(exist_ok=True)
(out / "part").write_text("half")
if n < fails:
    sys.stderr.write(message + "\\n")
    sys.exit(134)
"""


def _run(tmp_path, fails: int, message: str) -> tuple[int, Exception | None]:
    out = tmp_path / "out"
    out.mkdir()
    counter = tmp_path / "counter"
    try:
        run_job(
            [sys.executable, "-c", JOB, str(counter), str(fails), message, str(out)],
            "job",
            env=checkout_env(),
            clean=out,
        )
        err = None
    except RuntimeError as exc:
        err = exc
    return len(counter.read_text()), err


def test_teardown_abort_once_is_run_again_and_passes(tmp_path):
    runs, err = _run(tmp_path, 1, TEARDOWN_ABORT)
    assert (runs, err) == (2, None)


def test_teardown_abort_twice_is_run_a_third_time_and_passes(tmp_path):
    runs, err = _run(tmp_path, 2, TEARDOWN_ABORT)
    assert (runs, err) == (3, None)


def test_teardown_abort_every_time_fails_with_every_stderr(tmp_path):
    runs, err = _run(tmp_path, 3, TEARDOWN_ABORT)
    assert runs == 3 and err is not None
    assert str(err).count(TEARDOWN_ABORT) == 3 and str(err).count("--- then ---") == 2


@pytest.mark.parametrize(
    "message", ["Traceback: AssertionError", "RuntimeError: Connection reset by peer"]
)
def test_any_other_failure_is_not_tried_again(tmp_path, message):
    runs, err = _run(tmp_path, 1, message)
    assert runs == 1 and err is not None and message in str(err) and "job failed (134)" in str(err)


def test_the_passing_attempt_is_returned(tmp_path):
    """After one teardown abort, the second attempt's result comes back: its exit 0 and what it printed."""
    counter = tmp_path / "counter"
    job = (
        "import sys\nfrom pathlib import Path\nc = Path(sys.argv[1])\n"
        "n = len(c.read_text()) if c.exists() else 0\nc.write_text('x' * (n + 1))\n"
        "print('attempt', n + 1); sys.stderr.write(f'err {n + 1}\\n')\n"
        f"if n == 0:\n    sys.stderr.write({TEARDOWN_ABORT!r} + '\\n'); sys.exit(134)\n"
    )
    proc = run_job([sys.executable, "-c", job, str(counter)], "job", env=checkout_env())
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "attempt 2\n", "err 2\n")


def test_clean_removes_every_folder_before_the_next_attempt(tmp_path):
    """clean: several folders (a job's output and its work folder); each is removed after the abort, so the
    next attempt finds none of the last one's output (the job fails when it does); remake: each made again, empty."""
    folders = [tmp_path / "out", tmp_path / "work"]
    job = (
        "import sys\nfrom pathlib import Path\nc = Path(sys.argv[1])\n"
        "n = len(c.read_text()) if c.exists() else 0\nc.write_text('x' * (n + 1))\n"
        "for f in map(Path, sys.argv[2:]):\n"
        "    if f.exists() and any(f.iterdir()):\n        sys.exit(f'{f} holds the last attempt')\n"
        "    print(f.name, f.exists())\n    f.mkdir(exist_ok=True); (f / 'part').write_text('half')\n"
        f"if n == 0:\n    sys.stderr.write({TEARDOWN_ABORT!r} + '\\n'); sys.exit(134)\n"
    )
    argv = [sys.executable, "-c", job, str(tmp_path / "counter"), *map(str, folders)]
    assert run_job(argv, "job", checkout_env(), folders).stdout == "out False\nwork False\n"
    assert (tmp_path / "counter").read_text() == "xx"
    for f in folders:
        shutil.rmtree(f)
    (tmp_path / "counter").unlink()
    proc = run_job(argv, "job", checkout_env(), tuple(folders), remake=True)
    assert proc.stdout == "out True\nwork True\n"  # made again, empty: the job found no 'part'


# the job: ignores SIGTERM, starts a grandchild in its session that notes SIGTERM (a file) and keeps running, writes
# both pids once the grandchild's handler is set, then sleeps; only SIGKILL ends either
IGNORES_SIGTERM = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = (
    "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, lambda *a: open(sys.argv[1], 'w').close())\\n"
    "print('set', flush=True)\\n"
    "while True: time.sleep(1)\\n"
)
grand = subprocess.Popen([sys.executable, "-c", child, sys.argv[2]], stdout=subprocess.PIPE, text=True)
assert grand.stdout.readline() == "set\\n"
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {grand.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("started", flush=True)
while True:
    time.sleep(1)
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie (ended; this container's init may not reap it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_run_once_past_its_timeout_ends_every_process_of_the_job(tmp_path):
    """A job that ignores SIGTERM and has a grandchild in its session: past the timeout SIGTERM reaches the whole
    session (the grandchild notes it), SIGKILL then ends both, and TimeoutExpired carries what the job printed.
    (About 20 s to the timeout, then the 30 s run_once gives SIGTERM.)"""
    pids, termed = tmp_path / "pids", tmp_path / "termed"
    argv = [sys.executable, "-c", IGNORES_SIGTERM, str(pids), str(termed)]
    with pytest.raises(subprocess.TimeoutExpired) as exc:
        run_once(argv, 20, checkout_env())
    assert pids.exists(), "the job did not start its grandchild within the 20 s timeout"
    assert "started" in exc.value.stdout
    assert termed.exists()  # SIGTERM went to the session, the grandchild's too
    job, grandchild = map(int, pids.read_text().split())
    for pid in (job, grandchild):
        deadline = (
            time.monotonic() + 60
        )  # a bounded wait for the kernel to finish the kill, not a timing check
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(pid), f"process {pid} of the job outlived run_once"


END_JOB = """
import atexit, sys
from pathlib import Path
from cliresult import end_job
atexit.register(lambda: print("atexit ran"))
out = Path(sys.argv[1])
print("printed, not flushed")
sys.stderr.write("to stderr")
end_job({out / "a.json": "A" * 100_000, out / "b.json": "b"})
print("after end_job")
"""


def test_end_job_writes_each_result_whole_flushes_and_exits_0(tmp_path):
    """Each result replaces what was there with all of its text (no temp file left); what the job printed reaches
    the pipes although os._exit skips the flush at exit; nothing after end_job runs, nor an atexit handler."""
    (tmp_path / "b.json").write_text("an older, longer result")
    env = checkout_env(PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), str(SCRIPTS)]))
    env.pop(
        "PYTHONUNBUFFERED", None
    )  # the job's streams buffered, as in a plain run: end_job's flush matters
    proc = run_once([sys.executable, "-c", END_JOB, str(tmp_path)], 120, env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "printed, not flushed\n", "to stderr")
    assert (tmp_path / "a.json").read_text() == "A" * 100_000
    assert (tmp_path / "b.json").read_text() == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]
