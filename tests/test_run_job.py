"""tests/cliresult.run_job: the helper that runs the real framework jobs behind the fixtures tries again only on
gloo's teardown abort, and fails with every attempt's stderr otherwise."""

import sys

import pytest
from cliresult import TEARDOWN_ABORT, checkout_env, run_job

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
