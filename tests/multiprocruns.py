"""Real 2-process training runs with the callbacks, on CPU (gloo), for tests/test_callbacks_multiproc.py
and bench/bench_callbacks.py. Run as a program (one process per rank):

    python -m torch.distributed.run --nproc_per_node 2 --master_port P tests/multiprocruns.py hf OUT WORK [opts]
    python tests/multiprocruns.py pl OUT WORK [opts]        # Lightning Trainer(strategy="ddp", devices=2)

Options (JSON, argv[4]): idle_worker (HF, without the callback: start the callback's worker process anyway, idle, as
a control), detect_every (Lightning: the callback's detect_every; default every step), step_sleep (seconds each step waits, as a step waiting for its GPU leaves the
CPU idle: the workers validate then), save_every (the run without the callback saves every N steps; 10), time_hooks (the callback's own CPU and wall time per rank, and its worker's CPU, into WORK/hooks-R.json;
each step event carries the rank process's CPU seconds), policy, max_steps, spike_step, devices (Lightning; 1: one process; HF: run
without torchrun), log_level (HF TrainingArguments), quiet (Lightning's logger at WARNING), kill_step (rank 1 kills itself with SIGKILL in
the middle of that save; HF with kill_after_state: once rank 0 has written that save's trainer_state.json), level, callback (false: the same run without the callback), verdicts (after
training, the ranks validate copies of the last checkpoint together: clean and with one of rank 1's
files corrupted). Every rank appends events to WORK/events-R.jsonl: write_start / write_end of each
save (the framework's own save call), the worker's phases (validate / manifest / prune / idle, each
stamped by the worker's clock as it enters the phase, before it does the work: jobs linger `phase_delay` seconds), and
step wall times; rank 0 writes WORK/records.json (the callback's records and problems).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from cliresult import end_job, write_atomic  # noqa: E402

#: what runs as the job ends (before end_job's os._exit, which skips atexit): time_hooks' dump
AT_END: list = []
TRIGGERS = ["loss_spike_detected", "gradient_norm_exceeded"]
POLICY = {
    "frequency": "every_10_steps",
    "keep_last": 1,
    "emergency_save_on": TRIGGERS,
    "async_save": True,
}


class Events:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.rank = 0

    def __call__(self, **kw) -> None:
        with open(self.work / f"events-{self.rank}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"t": time.time(), "rank": self.rank, **kw}) + "\n")


HOOKS = (
    "decide_emergency",
    "start_reduced",
    "finish_reduced",
    "before_save",
    "saved",
    "forced_save",
)


def time_hooks(ev: Events) -> None:
    """Wrap StrategyCore's training-thread entry points: CPU (thread_time) and wall seconds per rank (and
    per entry point: by_hook {name: [cpu, wall, calls, the first call's cpu]}), written to WORK/hooks-R.json when the
    process exits, not at each call: a file write per hook call is the bench's cost, not the callback's, and it
    made the runs with the callback 2-3 ms a step slower (bench/bench_callbacks.py reads them). Also, in both runs,
    WORK/threads-R.json at exit: each thread's CPU (the main thread apart) and the garbage collector's collections
    and seconds by generation, with the times of the full ones."""
    import atexit

    from checkpoint_strategy.callbacks.core import StrategyCore

    totals: dict = {}
    import gc

    gcs = {"gc_seconds": [0.0, 0.0, 0.0], "gc_count": [0, 0, 0], "t0": 0.0}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gcs["t0"] = time.thread_time()
        else:
            gcs["gc_seconds"][info["generation"]] += time.thread_time() - gcs["t0"]
            gcs["gc_count"][info["generation"]] += 1
            if info["generation"] == 2:
                gcs.setdefault("gen2_at", []).append(time.time())

    gc.callbacks.append(on_gc)

    def dump() -> None:
        if ev.rank in totals:
            (ev.work / f"hooks-{ev.rank}.json").write_text(json.dumps(totals[ev.rank]))
        (ev.work / f"threads-{ev.rank}.json").write_text(
            json.dumps(_thread_cpu() | gcs | {"objects": len(gc.get_objects())})
        )

    atexit.register(dump)  # a run with a rank killed ends the plain way
    AT_END.append(
        dump
    )  # the others leave with os._exit (cliresult.end_job), which runs no atexit handler
    for name in HOOKS:
        fn = getattr(StrategyCore, name)

        def timed(self, *a, _fn=fn, _name=name, **k):
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                return _fn(self, *a, **k)
            finally:
                t = totals.setdefault(ev.rank, {"cpu": 0.0, "wall": 0.0, "calls": 0})
                t["cpu"] += time.thread_time() - c0
                t["wall"] += time.perf_counter() - w0
                t["calls"] += 1
                per = t.setdefault("by_hook", {}).setdefault(_name, [0.0, 0.0, 0, 0.0])
                per[0] += time.thread_time() - c0
                per[1] += time.perf_counter() - w0
                per[2] += 1
                if per[2] == 1:  # the first call's CPU (one-time imports), apart
                    per[3] = per[0]

        setattr(StrategyCore, name, timed)
    from checkpoint_strategy.callbacks.core import _ProcessWorker

    close = _ProcessWorker.close

    def closing(self):  # the worker's CPU seconds (all its threads), read once its jobs are done
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            t = totals.setdefault(ev.rank, {"cpu": 0.0, "wall": 0.0, "calls": 0})
            t["worker_cpu"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
        close(self)

    _ProcessWorker.close = closing


def _thread_cpu() -> dict:
    """CPU seconds (user + system) of this process's threads from /proc (Linux): the main thread apart, the
    others by name (Python threads are all named after the program)."""
    out: dict = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        key = "main" if int(task.name) == os.getpid() else name
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _records(cb) -> dict:
    return {
        "records": [
            {
                "path": r.path,
                "step": r.step,
                "status": r.status,
                "problem": r.problem,
                "deleted": r.deleted,
                "emergency": r.emergency,
            }
            for r in cb.core.records
        ],
        "problems": cb.core.problems,
        "summary": cb.core.summary(),
    }


def _largest_member(path: Path) -> tuple[int, int]:
    """(file offset of the middle byte, size) of the largest stored tensor of a torch zip file."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max(
            (i for i in z.infolist() if not i.filename.endswith(".pkl")),
            key=lambda i: i.compress_size,
        )
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        head = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return (
        info.header_offset + 30 + name_len + extra_len + info.compress_size // 2,
        info.compress_size,
    )


def _verdicts(cb, ckpt: str, work: Path, rank: int) -> None:
    """Both ranks validate copies of `ckpt` at level full, each its part, the verdict reduced: a clean
    copy, then one with a byte flipped in a zip member of a file rank 1's part reads."""
    import shutil

    import torch.distributed as dist

    from checkpoint_strategy.callbacks.core import StrategyCore
    from checkpoint_strategy.validate import parts

    clean, bad = (
        work / "verdict" / "clean" / os.path.basename(ckpt),
        work / "verdict" / "bad" / os.path.basename(ckpt),
    )
    if rank == 0:
        shutil.copytree(ckpt, clean) if os.path.isdir(ckpt) else (
            clean.parent.mkdir(parents=True),
            shutil.copy(ckpt, clean),
        )
        shutil.copytree(ckpt, bad) if os.path.isdir(ckpt) else (
            bad.parent.mkdir(parents=True),
            shutil.copy(ckpt, bad),
        )
        target = bad
        if bad.is_dir():  # a torch zip that rank 1's part reads every byte of
            theirs = [
                bad / f
                for f in parts.split(str(bad), 1, 2).files()
                if f.endswith((".pt", ".pth", ".bin"))
            ]
            target = max(theirs, key=lambda p: _largest_member(p)[1])
        offset, _size = _largest_member(target)
        with open(
            target, "r+b"
        ) as fh:  # a flipped byte inside tensor data: only its zip CRC-32 tells
            fh.seek(offset)
            byte = fh.read(1)
            fh.seek(offset)
            fh.write(bytes([byte[0] ^ 0xFF]))
        (work / "verdict" / "corrupted.txt").write_text(str(target))
    dist.barrier()
    out = {}
    for name, path in (("clean", clean), ("bad", bad)):
        core = StrategyCore(
            {"frequency": "every_10_steps", "keep_last": None, "validate_on_save": True},
            level="full",
            handoff_dir=None,
            manifest=False,
            rank_timeout=60,
        )
        core.root = str(path.parent)
        core.saved(str(path), None)
        core.end()
        if rank == 0:
            rec = core.records[-1]
            out[name] = {"path": str(path), "status": rec.status, "problem": rec.problem}
    if rank == 0:
        write_atomic(work / "verdicts.json", json.dumps(out))


def _hf_callbacks(opts: dict, ev: Events, callbacks: list) -> tuple[list, Any]:
    """The HF run's callbacks: `callbacks`, then HFCheckpointStrategy (or, without it and with idle_worker, an
    idle worker process as the bench's control); and the strategy callback (None without it)."""
    from transformers import TrainerCallback

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    cb = None
    if opts.get("callback", True):
        cb = HFCheckpointStrategy(
            opts.get("policy", POLICY),
            handoff_dir=None,
            level=opts.get("level", "quick"),
            rank_timeout=opts.get("rank_timeout", 60),
        )
        cb.core.phase_hook = lambda phase, path, t: ev(
            what="phase", phase=phase, path=os.path.basename(path), t=t
        )
        cb.core.phase_delay = opts.get("phase_delay", 0.05)
        callbacks.append(cb)
    elif opts.get("idle_worker"):  # the run without the callback, beside an idle worker process
        from checkpoint_strategy.callbacks.core import _ProcessWorker

        class IdleWorker(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                self.worker = _ProcessWorker(lambda msg: None)

            def on_train_end(self, args, state, control, **kw):
                self.worker.close()

        callbacks.append(IdleWorker())
    return callbacks, cb


def hf(out: Path, work: Path, opts: dict) -> None:
    import realruns
    from transformers import Trainer, TrainerCallback

    # imported in both runs, so the runs without the callback load the same modules (the bench compares them)
    from checkpoint_strategy.callbacks import HFCheckpointStrategy  # noqa: F401

    rank = int(os.environ.get("RANK", "0"))
    ev = Events(work)
    ev.rank = rank
    if opts.get("time_hooks"):
        time_hooks(ev)
    kill_step = opts.get("kill_step")
    orig_save, orig_rng = Trainer._save_checkpoint, Trainer._save_rng_state

    def save(self, model, trial):
        ev(what="write_start", step=self.state.global_step)
        orig_save(self, model, trial)
        ev(what="write_end", step=self.state.global_step)

    def rng(self, output_dir):
        if rank == 1 and kill_step == self.state.global_step:
            if opts.get(
                "kill_after_state"
            ):  # a slow rank: rank 0 has finished its part of the save (its
                state = (
                    Path(output_dir) / "trainer_state.json"
                )  # trainer_state.json is its last file)
                deadline = time.monotonic() + 120
                while not state.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
            ev(what="killed", step=kill_step)
            os.kill(
                os.getpid(), signal.SIGKILL
            )  # mid-save: rank 0 has written or is writing its files
        orig_rng(self, output_dir)

    Trainer._save_checkpoint, Trainer._save_rng_state = save, rng

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            ev(what="step", step=state.global_step, cpu=time.process_time())
            if opts.get("step_sleep"):
                time.sleep(opts["step_sleep"])

    callbacks, cb = _hf_callbacks(
        opts, ev, [realruns._spike_callback(opts.get("spike_step"), 4.0), Steps()]
    )
    args = realruns._training_args(
        out, max_steps=opts.get("max_steps", 60), save_steps=opts.get("save_every", 10)
    )
    args.ddp_backend = "gloo"
    args.log_level = opts.get("log_level", "passive")
    trainer = Trainer(
        model=realruns._tiny_gpt2(),
        args=args,
        train_dataset=realruns._TokenDataset(4096, 16, 64),
        callbacks=callbacks,
    )
    trainer.train()
    ev(what="done")
    if cb is not None and rank == 0:
        write_atomic(work / "records.json", json.dumps(_records(cb)))
    if opts.get("verdicts") and cb is not None:
        _verdicts(cb, os.path.join(out, f"checkpoint-{trainer.state.global_step}"), work, rank)


def pl(out: Path, work: Path, opts: dict) -> None:
    import callbackruns
    import pytorch_lightning as lightning

    ev = Events(work)
    ev.rank = int(os.environ.get("LOCAL_RANK", "0"))
    if opts.get("time_hooks"):
        time_hooks(ev)
    kill_step = opts.get("kill_step")
    orig_save = lightning.Trainer.save_checkpoint

    def save(self, filepath, *a, **k):
        ev.rank = self.global_rank
        ev(what="write_start", step=self.global_step, path=os.path.basename(str(filepath)))
        result = orig_save(self, filepath, *a, **k)
        ev(what="write_end", step=self.global_step, path=os.path.basename(str(filepath)))
        return result

    lightning.Trainer.save_checkpoint = save
    if opts.get("quiet"):  # how a user silences Lightning's own progress lines
        import logging

        logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)

    class Probe(lightning.Callback):
        def on_train_batch_start(self, trainer, module, batch, idx):
            ev.rank = trainer.global_rank
            ev(what="step", step=trainer.global_step, cpu=time.process_time())
            if opts.get("step_sleep"):
                time.sleep(opts["step_sleep"])

        def on_save_checkpoint(self, trainer, module, checkpoint):
            if trainer.global_rank == 1 and kill_step == trainer.global_step:
                ev(what="killed", step=kill_step)
                os.kill(os.getpid(), signal.SIGKILL)

    hooks = {
        "phase_hook": lambda phase, path, t: ev(
            what="phase", phase=phase, path=os.path.basename(path), t=t
        ),
        "phase_delay": opts.get("phase_delay", 0.05),
    }
    cb, trainer, _m = callbackruns.lightning_train(
        out,
        opts.get("policy", POLICY),
        max_steps=opts.get("max_steps", 60),
        spike_step=opts.get("spike_step"),
        spike_scale=10.0,
        hooks=hooks,
        extra_callbacks=[Probe()],
        devices=opts.get("devices", 2),
        strategy="ddp" if opts.get("devices", 2) > 1 else "auto",
        with_callback=opts.get("callback", True),
        save_every=opts.get("save_every", 10),
        handoff_dir=None,
        level=opts.get("level", "quick"),
        rank_timeout=opts.get("rank_timeout", 60),
        **({"detect_every": opts["detect_every"]} if opts.get("detect_every") else {}),
    )
    ev(what="done")
    if cb is not None and trainer.global_rank == 0:
        write_atomic(work / "records.json", json.dumps(_records(cb)))
    if opts.get("verdicts") and cb is not None:
        last = max(
            Path(out).glob("epoch=*-step=*.ckpt"),
            key=lambda p: int(p.stem.split("step=")[1].split("-")[0]),
        )
        _verdicts(cb, str(last), work, trainer.global_rank)


if __name__ == "__main__":
    kind, out_dir, work_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    # every rank appends its events there (a retried run's folder was removed)
    work_dir.mkdir(parents=True, exist_ok=True)
    {"hf": hf, "pl": pl}[kind](out_dir, work_dir, options)
    # a run with a rank killed ends the plain way (the test asserts it failed); the others meet, then leave without
    # C++ teardown: gloo's threads can abort a process whose work is done ('terminate called without an active
    # exception'): CI saw it twice on this HF run, once after destroy_process_group
    if options.get("kill_step") is None:
        for fn in AT_END:
            fn()
        end_job()
