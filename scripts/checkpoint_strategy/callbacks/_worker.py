"""The background worker: validate-then-prune (and handoff) jobs, in a separate process.

A thread would share the GIL with the training loop: while it validated, every Python line of
the training step (the Trainer's own loop, the callbacks) could wait up to the interpreter's
switch interval (5 ms). A child process validates and prunes in parallel without slowing the
training thread; the training process only writes one JSON line per save to the child's stdin.

Protocol (JSON lines): the parent writes jobs ``{"id", "kind": "save"|"handoff", ...}``; the
worker answers ``{"phase": "validate"|"manifest"|"prune-wait"|"prune"|"idle", "path", "t"}`` (t: its own wall clock) as it goes and one result line
``{"id", ...}`` per job (see ``process_job`` / ``handoff_job``). It exits at the end of stdin, so
a training process that dies leaves the worker to finish the job it is on (every step of it is
crash-safe) and stop. Run as ``python -m checkpoint_strategy.callbacks._worker``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Optional

from checkpoint_strategy.callbacks import _retention
from checkpoint_strategy.formats import archive
from checkpoint_strategy.formats import tensors as tensorscan
from checkpoint_strategy.storage.locking import locked

PhaseFn = Optional[Callable[[str, str], None]]
_PARENT: Optional[int] = None  # the training process, when running as its worker process (main)


def _orphaned() -> bool:
    """The training process that started this worker has exited (the worker was re-parented)."""
    return _PARENT is not None and os.getppid() != _PARENT


def process_job(job: dict, phase: PhaseFn = None) -> dict:
    """Validate the new checkpoint; when valid and keep_last is set, prune under root.

    Pure function of the job (used inline when async_save is off, and by the worker process)."""
    started = time.perf_counter()
    path, delay = job["path"], float(job.get("phase_delay") or 0.0)
    out: dict[str, Any] = {
        "id": job.get("id"),
        "status": None,
        "problem": None,
        "deleted": [],
        "kept_reasons": {},
        "prune_errors": [],
        "seconds": 0.0,
        "error": None,
    }

    def enter(name: str) -> None:
        if phase is not None:
            phase(name, path)
        if delay:
            time.sleep(delay)

    try:
        if not os.path.lexists(path):  # pruned by an earlier job that ran late (or removed by hand)
            out["status"] = "gone"
            return out
        if job.get("validate"):
            enter("validate")
            _idle(_validate_into, out, path, job.get("level", "quick"))
            if out["status"] != "valid":
                return out
        elif job.get("verdict"):  # validated by every rank's part (many processes)
            out["status"] = job["verdict"]
        if job.get("manifest") and out["status"] == "valid":
            enter("manifest")
            _idle(_manifest_into, out, path)
        if job.get("keep_last") and job.get("root"):
            enter("prune-wait")
            _await_folder(job["root"], float(job.get("lock_timeout") or 600.0))
            _prune_into(out, job, phase)
    except Exception as exc:  # noqa: BLE001 - reported by the parent, never raised into training
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        out["seconds"] = round(time.perf_counter() - started, 4)
        if phase is not None:
            phase("idle", path)
    return out


def part_job(job: dict, phase: PhaseFn = None) -> dict:
    """This rank's part of a save's validation (validate/parts.py): {"id", "status", "problem"}."""
    out: dict[str, Any] = {"id": job.get("id"), "status": "valid", "problem": None, "error": None}
    part = job.get("part")
    if part is None:  # level deep: rank 0 checks the whole checkpoint
        return out
    if phase is not None:
        phase("validate", job["path"])
    if job.get("phase_delay"):
        time.sleep(float(job["phase_delay"]))
    try:
        if not os.path.lexists(
            job["path"]
        ):  # pruned by a job that ran late (a newer save had validated)
            out["status"], out["problem"] = "gone", "the checkpoint is gone"
        else:
            _idle(_validate_into, out, job["path"], job.get("level", "quick"), tuple(part))
    except Exception as exc:  # noqa: BLE001 - reported as this part's verdict
        out["status"], out["error"] = None, f"{type(exc).__name__}: {exc}"
        out["problem"] = out["error"]
    finally:
        if phase is not None:
            phase("idle", job["path"])
    return out


def _await_folder(root: str, timeout: float) -> None:
    """Until no save holds the folder (the callbacks hold its lock from right before a save until it
    is written); prune takes the same lock itself for its survey and deletions."""
    try:
        with locked(root, timeout, "a save still holds it"):
            pass
    except Exception:  # noqa: BLE001 - prune waits for the lock itself and reports what it finds
        pass


def _manifest_into(out: dict[str, Any], path: str) -> None:
    """The sha256 manifest of a valid checkpoint (`validate --manifest verify` checks it later)."""
    try:
        out["manifest"] = _retention.write_manifest(path)
    except Exception as exc:  # noqa: BLE001 - a manifest that cannot be written is reported, never fatal
        out["manifest_error"] = f"{type(exc).__name__}: {exc}"


def _validate_into(
    out: dict[str, Any], path: str, level: str, part: tuple[int, int] = (0, 1)
) -> None:
    """The checkpoint's status and first problem, into the job's answer."""
    try:
        result = _retention.validate(path, level, part)
    except Exception as exc:  # noqa: BLE001 - a vanished path is a finding, not a crash
        out["status"], out["problem"] = "invalid", str(exc)
        return
    out["status"] = result.status
    if result.problems:
        p = result.problems[0]
        more = f" (+{len(result.problems) - 1} more)" if len(result.problems) > 1 else ""
        out["problem"] = f"{p.file}: {p.reason}{more}"


def _prune_into(out: dict[str, Any], job: dict, phase: PhaseFn = None) -> None:
    """Apply the keep rules under the job's root; what was deleted and why the rest was kept, into the answer."""
    if _orphaned():  # the training died (mid-save?): delete nothing on its behalf
        out["error"] = "the training process is gone: prune skipped"
        return

    logfile = job.get("log")
    if logfile and not os.path.lexists(logfile):
        logfile = None  # read when the prune runs, not when the job was queued
    report = _retention.prune(
        job["root"],
        job["keep_last"],
        job.get("milestones") or [],
        level=job.get("level", "quick"),
        protect=job.get("protect") or None,
        log=logfile,
        lock_timeout=float(job.get("lock_timeout") or 600.0),
        delete_invalid=bool(job.get("delete_invalid")),
        on_start=None if phase is None else lambda: phase("prune", job["path"]),
        # the end stamped while the lock is held: a save waiting for it starts after the stamp
        # (stamped after, the report built in between could put it after the save's start)
        on_end=None if phase is None else lambda: phase("idle", job["path"]),
    )
    out["deleted"] = [e.name for e in report.delete if e.deleted]
    out["kept_reasons"] = {e.name: e.reasons for e in report.keep}
    out["prune_errors"] = [f"{p.file}: {p.reason}" for p in report.errors]


def handoff_job(job: dict) -> dict:
    """Write the session-handoff state for root (what the `handoff` command writes) plus extra risks."""
    out: dict[str, Any] = {"id": job.get("id"), "error": None}
    try:
        from checkpoint_strategy.integrations import handoff
        from checkpoint_strategy.planning.models import PlanReport

        report = PlanReport(**job["report"]) if job.get("report") else None
        doc = handoff.build(report, job["root"], level=job.get("level", "quick"))
        doc.pending_risks.extend(r for r in job.get("risks") or [] if r not in doc.pending_risks)
        doc.automatic_actions = list(job.get("actions") or [])
        doc.pending_risks.extend(
            f"training callback stopped the run: {a.get('message')}"
            for a in doc.automatic_actions
            if a.get("event") == "checkpoint-strategy:stop"
        )
        handoff.write(job["state_dir"], doc)
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
    "CHECKPOINT_STRATEGY_PROCESSES": "1",
}  # and no checks split over processes (validate/fanout.py)
_IDLE: Any = (
    None  # the worker's reading thread (SCHED_IDLE), when running as the worker process (main)
)


#: seconds a job may wait for idle cycles; past it, this thread (normal class, nice 19) does it (a machine whose
#: cores never idle, e.g. data-loader workers on every core, must not leave checkpoints unvalidated and unpruned)
IDLE_GRACE = 120.0


def _idle(fn: Callable[..., None], out: dict, *args: Any) -> None:
    """fn(out, *args) on the reading thread (only idle cycles), or here when there is none (inline jobs) or when
    it has not finished within IDLE_GRACE seconds: then this thread runs it too and its result counts (the
    reading thread's late one goes into a copy, discarded; a check only reads, a manifest is an atomic write)."""
    if _IDLE is None:
        fn(out, *args)
        return

    mine = dict(out)
    fut = _IDLE.submit(fn, mine, *args)
    try:
        fut.result(timeout=IDLE_GRACE)
    except FutureTimeout:
        fut.cancel()
        fn(out, *args)
        return
    out.update(mine)


def _idle_class() -> None:
    """This thread (and the threads it starts: the CRC threads) into the SCHED_IDLE class (Linux): the
    scheduler runs it only on a core nothing else wants, and a training thread that wakes takes the core
    back at once. Per thread, and an unprivileged thread cannot leave it, hence a thread of its own."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        pass


def _yield_cpu() -> None:
    """The worker runs beside training and must only take idle cycles (docs/callbacks.md, Cost).

    Everything that reads checkpoint bytes (validation, the sha256 manifest) runs on one reading thread
    in the SCHED_IDLE class; the main thread, which prunes holding the folder's lock (a save may wait
    for it), stays in the normal class at nice 19, so a busy machine slows it but never starves it
    (SCHED_IDLE there would starve the save behind it). One thread for the CRC and value scans and,
    through the environment the training process gives it (ONE_THREAD), for OpenMP / BLAS / numba."""
    global _IDLE
    try:
        os.nice(19 - os.nice(0))
    except (OSError, AttributeError):
        pass

    archive.CRC_WORKERS = 1
    tensorscan.WORKERS = 1
    _IDLE = ThreadPoolExecutor(
        1, thread_name_prefix="checkpoint-strategy-idle", initializer=_idle_class
    )
    _IDLE.submit(_warm)  # the thread starts now; the first save's job finds the checkers imported


def _warm() -> None:
    """Import the checkers and the prune now, in idle cycles, not in the first save's job (~0.2 s of CPU)."""
    from checkpoint_strategy.callbacks import _retention  # noqa: F401
    from checkpoint_strategy.formats import manifest  # noqa: F401
    from checkpoint_strategy.recovery import advise  # noqa: F401
    from checkpoint_strategy.retention import prune  # noqa: F401
    from checkpoint_strategy.validate import validate_checkpoint  # noqa: F401


def _parent_gone() -> None:
    """The training process closed our stdout (it exited): no traceback into its log, now or at exit (the
    unflushed rest goes to /dev/null); the job at hand goes on (every step is crash-safe), then stdin ends."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main() -> int:
    global _PARENT
    _PARENT = os.getppid()
    _yield_cpu()
    # Ctrl-C in the training's terminal reaches this process too: the training process decides (this one finishes
    # the job at hand and stops when its stdin ends), and no KeyboardInterrupt traceback lands in the training log
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gone = False

    def emit(msg: dict) -> None:
        nonlocal gone
        if gone:
            return
        try:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):  # (ValueError: stdout closed)
            gone = True
            _parent_gone()

    for line in sys.stdin:
        if not line.strip():
            continue
        if not line.endswith("\n"):  # a job cut short: the training process died while writing it
            break
        job = json.loads(line)
        if job.get("kind") == "handoff":
            emit(handoff_job(job))
        elif job.get("kind") == "part":
            emit(part_job(job, lambda p, path: emit({"phase": p, "path": path, "t": time.time()})))
        else:
            emit(
                process_job(job, lambda p, path: emit({"phase": p, "path": path, "t": time.time()}))
            )
    return 0


def _exit(code: int) -> None:
    """Exit without joining the reading thread: once stdin has ended no job is on it (every job is waited for),
    only perhaps `_warm`'s imports, which a machine with no idle cycle may never let finish (the process would
    then outlive the training's close grace and be killed)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
