"""Callbacks without a framework: lazy imports, policy inputs, the marker, last_valid_checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint_strategy.callbacks.policy import resolve
from checkpoint_strategy.errors import UsageError

PKG_PARENT = str(Path(__file__).resolve().parent.parent / "scripts")
HEAVY = (
    "transformers",
    "pytorch_lightning",
    "lightning",
    "torch",
    "numpy",
    "checkpoint_strategy.callbacks",
)


def _modules_after(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=PKG_PARENT)
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_plan_loads_nothing_of_the_callbacks():
    mods = _modules_after(
        "import io, contextlib\nfrom checkpoint_strategy.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['plan', '100000', '2', '2000', '--model_size_gb', '2'])"
    )
    assert not [m for m in mods if m.split(".")[0] in HEAVY[:5] or m.startswith(HEAVY[5])]


def test_importing_the_package_loads_no_framework():
    mods = _modules_after("import checkpoint_strategy.callbacks as c\nc.last_valid_checkpoint")
    assert not [
        m
        for m in mods
        if m.split(".")[0] in ("transformers", "pytorch_lightning", "lightning", "torch")
    ]


def test_policy_forms_agree(tmp_path):
    from checkpoint_strategy.cli.main import main
    from checkpoint_strategy.planning.options import plan_arguments  # noqa: F401

    plan_json = tmp_path / "plan.json"
    plan_yaml = tmp_path / "policy.yaml"
    import contextlib
    import io

    for fmt, path in (("json", plan_json), ("yaml", plan_yaml)):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert (
                main(["plan", "100000", "2", "2000", "--model_size_gb", "2", "--format", fmt]) == 0
            )
        path.write_text(buf.getvalue())
    a, b = resolve(str(plan_json)), resolve(plan_yaml)
    assert a.report is not None and b.report is None
    assert (a.frequency_steps, a.keep_last, a.milestones, a.emergency_save_on) == (
        b.frequency_steps,
        b.keep_last,
        b.milestones,
        b.emergency_save_on,
    )
    assert resolve(a.report) == a
    assert (
        resolve(
            {"checkpoint_policy": {"frequency": "every_500_steps", "keep_last": 3}}
        ).frequency_steps
        == 500
    )
    c = resolve(
        {"frequency": "every_500_steps", "keep_last": 3, "keep_milestone": [1000, 5000, "..."]}
    )
    assert c.milestones[:4] == (1000, 5000, 10000, 20000)


@pytest.mark.parametrize(
    "policy, words",
    [
        ({"keep_last": 3}, "no frequency"),
        ({"frequency": "every_30_minutes"}, "every_N_steps"),
        ({"frequency": "every_10_steps", "keep_last": 0}, "keep_last"),
        (
            {"frequency": "every_10_steps", "emergency_save_on": ["on_tuesdays"]},
            "emergency_save_on",
        ),
        ({"frequency": "every_10_steps", "surprise": 1}, "surprise"),
        (["every_10_steps"], "expected a plan"),
        ({"checkpoint_policy": [1, 2]}, "not a mapping"),
    ],
)
def test_bad_policies_one_line(policy, words):
    with pytest.raises(UsageError) as exc:
        resolve(policy)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_bad_policy_files(tmp_path):
    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="FIFO"):
        resolve(str(fifo))  # never blocks
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UsageError):
        resolve(str(deep))
    broken = tmp_path / "broken.yaml"
    broken.write_text("checkpoint_policy: [unclosed\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        resolve(str(broken))
    with pytest.raises(UsageError, match="does not exist"):
        resolve(str(tmp_path / "missing.yaml"))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"policy": {}, "frequency_steps": 3}))
    with pytest.raises(UsageError, match="plan.schema.json"):
        resolve(str(plan))


def test_marker_roundtrip_and_damage(tmp_path):
    from checkpoint_strategy.formats.marker import marker_path, read_marker, write_marker

    folder = tmp_path / "checkpoint-46"
    write_marker(folder, event="loss_spike_detected", step=46)  # marker first: creates the folder
    assert folder.is_dir() and read_marker(folder)["step"] == 46
    ckpt = tmp_path / "epoch=0-step=46-emergency.ckpt"
    write_marker(ckpt, event="gradient_norm_exceeded", step=46)
    assert marker_path(ckpt).endswith(".ckpt.checkpoint-strategy.json") and not ckpt.exists()
    Path(marker_path(folder)).write_text("{not json")
    assert read_marker(folder)["event"] is None  # damaged: still post-event
    Path(marker_path(folder)).write_text(json.dumps({"kind": "something-else"}))
    assert read_marker(folder) is None
    with pytest.raises(ValueError):
        write_marker(folder, event="nan", step=1)


def test_last_valid_checkpoint_inputs(tmp_path):
    from checkpoint_strategy.callbacks import last_valid_checkpoint

    assert last_valid_checkpoint(tmp_path / "not-yet") is None  # first run: start fresh
    assert last_valid_checkpoint(tmp_path) is None
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError):
        last_valid_checkpoint(f)
    with pytest.raises(UsageError):
        last_valid_checkpoint(tmp_path, level="deep-ish")


def test_level_deep_is_accepted_by_the_callbacks_and_resume(hf_run, tmp_path):
    """StrategyCore and last_valid_checkpoint take level="deep" like every command (issue 12); at deep the
    resume point is the newest that passes the deep check: checkpoint-120's weights norm jumped."""
    import shutil

    from checkpoint_strategy.callbacks import last_valid_checkpoint
    from checkpoint_strategy.callbacks.core import StrategyCore

    assert (
        StrategyCore({"frequency": "every_10_steps", "keep_last": 2}, level="deep").level == "deep"
    )
    with pytest.raises(UsageError):
        StrategyCore({"frequency": "every_10_steps"}, level="deep-ish")
    root = tmp_path / "run"
    for s in (110, 120):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", root / f"checkpoint-{s}")
    assert last_valid_checkpoint(root) == str(root / "checkpoint-120")
    assert last_valid_checkpoint(root, level="deep") == str(root / "checkpoint-110")


def test_last_valid_checkpoint_prefers_the_newest_resumable(hf_run, tmp_path):
    """A weights-only newest checkpoint (no optimizer.pt) would silently reset the optimizer: the newest
    resumable valid one wins; weights-only only when nothing is resumable."""
    import shutil

    from checkpoint_strategy.callbacks import last_valid_checkpoint

    root = tmp_path / "run"
    for s in (90, 100, 110):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", root / f"checkpoint-{s}")
    (root / "checkpoint-110" / "optimizer.pt").unlink()
    assert last_valid_checkpoint(root) == str(root / "checkpoint-100")
    assert last_valid_checkpoint(root, level="full") == str(root / "checkpoint-100")
    for s in (90, 100):
        (root / f"checkpoint-{s}" / "optimizer.pt").unlink()
    assert last_valid_checkpoint(root) == str(
        root / "checkpoint-110"
    )  # none resumable: the newest valid


def _task_stat(pid: int, tid: int) -> tuple[int, int]:
    """(nice, scheduling policy) of one thread (proc(5): fields 19 and 41)."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16]), int(fields[38])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE and /proc are Linux's")
def test_worker_reads_checkpoints_in_idle_cycles_and_prunes_at_nice_19(tmp_path):
    """The background worker beside training: its reading thread (validation, manifest, the CRC threads it
    starts) in SCHED_IDLE, its main thread (the prune, holding the folder's lock a save may wait for) in the
    normal class at nice 19, one thread for OpenMP / BLAS."""
    import time

    from checkpoint_strategy.callbacks.core import StrategyCore

    core = StrategyCore(
        {"frequency": "every_10_steps", "keep_last": 1, "async_save": True}, handoff_dir=None
    )
    core.root = str(tmp_path)
    core.start()
    worker = core._worker
    assert worker is not None
    pid = worker.proc.pid
    try:
        deadline = time.monotonic() + 30

        def stats_now() -> dict:
            return {int(t): _task_stat(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")}

        # (the reading thread is listed before it has moved itself to SCHED_IDLE: wait for that, under any load)
        while (
            not any(policy == 5 for tid, (_n, policy) in stats_now().items() if tid != pid)
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        stats = stats_now()
        assert stats[pid] == (19, 0), stats  # main thread: SCHED_OTHER, nice 19
        assert any(policy == 5 for tid, (_n, policy) in stats.items() if tid != pid), (
            stats
        )  # SCHED_IDLE
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"OMP_NUM_THREADS=1" in env and b"OPENBLAS_NUM_THREADS=1" in env
    finally:
        core.end()
    assert worker.proc.returncode == 0


def test_a_job_starved_of_idle_cycles_runs_in_the_normal_class_after_the_grace(monkeypatch):
    """On a machine whose cores never idle (data-loader workers on every core) the SCHED_IDLE reading thread may
    never run: after IDLE_GRACE the worker's main thread (nice 19, normal class) does the job, and the reading
    thread's late result goes into a copy."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from checkpoint_strategy.callbacks import _worker

    gate = threading.Event()

    def job(out: dict, x: int) -> None:
        if threading.current_thread().name.startswith("idle"):
            gate.wait(30)  # starved: it gets its cycles only after the fallback ran
        out["by"], out["x"] = threading.current_thread().name, x

    pool = ThreadPoolExecutor(1, thread_name_prefix="idle")
    monkeypatch.setattr(_worker, "_IDLE", pool)
    monkeypatch.setattr(_worker, "IDLE_GRACE", 0.2)
    out = {"status": None}
    _worker._idle(job, out, 5)
    assert out == {"status": None, "by": threading.current_thread().name, "x": 5}
    gate.set()
    pool.shutdown(wait=True)  # the late run finished, into its copy
    assert out["by"] == threading.current_thread().name
    # with idle cycles to spare, the reading thread does it
    idle = ThreadPoolExecutor(1, thread_name_prefix="idle")
    monkeypatch.setattr(_worker, "_IDLE", idle)
    monkeypatch.setattr(_worker, "IDLE_GRACE", 30.0)
    gate.set()
    out2: dict = {}
    _worker._idle(job, out2, 7)
    idle.shutdown(wait=True)
    assert out2["by"].startswith("idle") and out2["x"] == 7


def test_a_spike_seen_after_the_last_step_saves_nothing(tmp_path, caplog):
    """Lightning under many processes takes a step's averaged loss at the next step's end; the last step's comes
    after training ended (observe(saving=False)): logged, no emergency save, no marker."""
    from checkpoint_strategy.callbacks.core import StrategyCore

    core = StrategyCore(
        {"frequency": "every_10_steps", "emergency_save_on": ["loss_spike_detected"]},
        handoff_dir=None,
    )
    core.root = str(tmp_path)
    for step in range(1, 80):
        assert core.observe(step, 1.0 + 0.01 * (step % 7)) is None
    with caplog.at_level("WARNING", logger="checkpoint_strategy.callbacks"):
        assert core.observe(80, 50.0, saving=False) is None
    assert "the last step: no emergency save after training ended" in caplog.text
    assert [f.kind for f in core.flags] == ["loss_spike_detected"] and list(
        tmp_path.iterdir()
    ) == []
    fresh = StrategyCore(
        {"frequency": "every_10_steps", "emergency_save_on": ["loss_spike_detected"]},
        handoff_dir=None,
    )
    for step in range(1, 80):
        fresh.observe(step, 1.0 + 0.01 * (step % 7))
    assert fresh.observe(80, 50.0) is not None  # the same values during training: a save is due


def test_phase_stamps_are_the_workers_clock_not_when_the_line_arrived(tmp_path):
    """The worker stamps each phase with its own wall clock as it enters it; the training process hands that stamp
    to phase_hook, not the time its reader thread got the line (which waits for the GIL while a save holds it: a CI
    run saw a prune's end stamped 21 ms after the next save, which the prune's lock had kept waiting, began)."""
    import time

    from checkpoint_strategy.callbacks.core import StrategyCore

    core = StrategyCore(
        {"frequency": "every_10_steps", "keep_last": 1, "async_save": True}, handoff_dir=None
    )
    got: list[tuple[str, float]] = []
    core.phase_hook = lambda phase, path, t: got.append((phase, t))
    core._on_message({"phase": "prune", "path": "x", "t": 5.0})
    before = time.time()
    core._on_message({"phase": "idle", "path": "x"})  # an inline job's phase: stamped here, now
    core._on_message({"phase": "idle", "path": "x", "t": "soon"})  # not a number: stamped here
    assert got[0] == ("prune", 5.0) and before <= got[1][1] <= got[2][1] <= time.time(), got

    ckpt = tmp_path / "checkpoint-10"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"\0" * 16)
    proc = subprocess.run(
        [sys.executable, "-m", "checkpoint_strategy.callbacks._worker"],
        capture_output=True,
        text=True,
        timeout=60,
        input=json.dumps({"id": 1, "path": str(ckpt), "validate": True, "phase_delay": 0.2}) + "\n",
        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "scripts")),
    )
    phases = [json.loads(x) for x in proc.stdout.splitlines() if '"phase"' in x]
    assert [p["phase"] for p in phases] == ["validate", "idle"], proc.stdout + proc.stderr
    assert phases[1]["t"] - phases[0]["t"] >= 0.2  # the validate lingered 0.2 s in the worker


def test_the_workers_prune_ends_its_phase_while_the_folder_is_still_locked(tmp_path):
    """A worker job that prunes: its "idle" stamp (the prune's end) is made while the folder's lock is held, so the
    next save, which takes that lock, can only be stamped after it; then "idle" again as the job ends."""
    from checkpoint_strategy.callbacks._worker import process_job
    from checkpoint_strategy.storage.locking import locked

    root = tmp_path / "run"
    for step in (10, 20, 30):
        ckpt = root / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}      ")
    phases = []

    def phase(name, _path):
        held = False
        try:
            with locked(root, 0.0, "busy"):
                pass
        except UsageError:
            held = True
        phases.append((name, held))

    out = process_job(
        {
            "id": 1,
            "path": str(root / "checkpoint-30"),
            "root": str(root),
            "keep_last": 1,
            "lock_timeout": 5,
        },
        phase,
    )
    assert out["error"] is None, out
    assert phases == [("prune-wait", False), ("prune", True), ("idle", True), ("idle", False)], (
        phases
    )


def _worker_proc(tmp_path, **kw):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "scripts"))
    return subprocess.Popen(
        [sys.executable, "-m", "checkpoint_strategy.callbacks._worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


def test_the_worker_outliving_the_training_process_exits_quietly(tmp_path):
    """Issue 40: once the training process is gone (its end of the worker's stdout closed), the worker printed a
    BrokenPipeError traceback into the training log. Now it finishes the job at hand quietly and stops at the end of
    its stdin: exit 0, nothing on stderr. A job line cut short by a dying parent, and a Ctrl-C (SIGINT to the
    terminal's process group), end it quietly too."""
    import signal

    ckpt = tmp_path / "checkpoint-10"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"\0" * 16)
    job = {"id": 1, "path": str(ckpt), "validate": True, "phase_delay": 0.5}
    proc = _worker_proc(tmp_path)
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.flush()
    assert (
        json.loads(proc.stdout.readline())["phase"] == "validate"
    )  # the job has begun: now the parent "dies"
    proc.send_signal(signal.SIGINT)
    proc.stdout.close()
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0
    err = proc.stderr.read()
    assert err == "", err

    proc = _worker_proc(tmp_path)
    out, err = proc.communicate(
        json.dumps(job)[:20], timeout=120
    )  # a job line cut short, then stdin ends
    assert (proc.returncode, out, err) == (0, "", "")


@pytest.mark.parametrize("delete_invalid", [False, True])
def test_the_policys_delete_invalid_reaches_the_callbacks_prune(hf_run, tmp_path, delete_invalid):
    """delete_invalid in the policy: the prune after a save also removes an invalid checkpoint older than the
    newer valid one (off: kept for inspection, as `prune` does without --delete-invalid)."""
    import shutil

    from checkpoint_strategy.callbacks.core import StrategyCore

    root = tmp_path / "run"
    for s in (90, 100, 110):
        shutil.copytree(hf_run.output_dir / f"checkpoint-{s}", root / f"checkpoint-{s}")
    (root / "checkpoint-90" / "model.safetensors").write_bytes(b"torn")
    core = StrategyCore(
        {"frequency": "every_10_steps", "keep_last": 5, "delete_invalid": delete_invalid}
    )
    assert core.settings.delete_invalid is delete_invalid
    core.root = str(root)
    core.saved(str(root / "checkpoint-110"), 110)
    assert (root / "checkpoint-90").exists() is not delete_invalid
    assert (root / "checkpoint-100").exists() and (root / "checkpoint-110").exists()
