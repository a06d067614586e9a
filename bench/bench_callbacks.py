"""Benchmark: the training callbacks' own cost per training step, against the same run without them.

Two measurements, both in the same process:

1. Hook time on the training thread. A real HF Trainer run (tiny GPT-2, CPU, logging every step,
   a save every 10 steps, async validation) with HFCheckpointStrategy whose hooks are timed with
   perf_counter; the same for LightningCheckpointStrategy on a small MLP. Validation and pruning run
   on the background worker and are excluded (the issue's "validation excluded when async");
   everything the training thread does for the callback (the schedule check, the spike detector,
   handing the save to the worker, writing an emergency marker) is included. Printed as ms per
   step and as a ratio against a 20 ms step (target: at most 1 %) and against the baseline step
   time measured without the callback.
2. End to end: the same HF run with and without the callback, interleaved: the median of the
   per-step wall times and the mean (whole training time / steps, so the steps around a save, when
   the worker validates beside training, count too). Noisy on a shared machine: reported as ratios.
3. Two processes (--multiproc): the HF Trainer under `torchrun --nproc_per_node 2` (gloo, CPU) with
   and without HFCheckpointStrategy (tests/multiprocruns.py), and Lightning DDP with 2 devices: per-step
   wall time on rank 0, median and mean, with/without; with --step-sleep S each step also waits S seconds with the
   CPU idle, as a step waiting for its GPU does (the case the worker is built for: it validates in the idle
   cycles); per run, rank 0's main-thread CPU and full garbage collections (tests/multiprocruns.py threads-R.json).
4. Split validation (--multiproc): a real 4-shard DCP checkpoint (torch.distributed.checkpoint,
   FileSystemWriter with 4 writer threads, --dcp-mb MB) checked at level full by one process and by
   two processes each checking one part (`validate --part K/2`, run at the same time): wall times.

5. The recovery playbook (--playbook): end-to-end step time of a nanoGPT-style loop (a small MLP, Adam, GPU-like
   steps: each padded with --step-sleep seconds, 0.05 by default) with TrainingGuard answering every step (the
   online detector, the LR/clip/skip lookups; a save every 50 steps both ways) against the same loop without
   it, and the same for an HF Trainer with HFCheckpointStrategy, trainer.train vs train_with_recovery; runs
   interleaved, median and mean step with/without (target: within 1 %).

Usage: python bench/bench_callbacks.py [--steps N] [--pairs P] [--multiproc] [--dcp-mb MB] [--step-sleep S]
       python bench/bench_callbacks.py --playbook [--steps N] [--pairs P] [--step-sleep S]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import logging  # noqa: E402

logging.disable(logging.WARNING)

POLICY = {
    "frequency": "every_10_steps",
    "keep_last": 2,
    "keep_milestone": [25],
    "emergency_save_on": ["loss_spike_detected", "gradient_norm_exceeded"],
    "async_save": True,
}
STEP_TARGET = 0.020
# thread_time: CPU seconds of the training thread itself, so time the scheduler gives to other
# processes on a loaded machine is not charged to the callback (--clock wall for perf_counter)
CLOCK = time.thread_time


class Timer:
    """Per-name call timings of methods wrapped on an object."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = {}
        self.clock = CLOCK

    @property
    def seconds(self) -> float:
        return sum(sum(v) for v in self.calls.values())

    def typical(self) -> float:
        """Sum over names of (median call time x calls): leaves out the rare calls that waited for
        the GIL while the background worker validated (that time is the validation's)."""
        return sum(statistics.median(v) * len(v) for v in self.calls.values() if v)

    def wrap(self, obj, names):
        for name in names:
            fn = getattr(obj, name)
            bucket = self.calls.setdefault(name, [])

            def timed(*a, _fn=fn, _b=bucket, **k):
                t0 = self.clock()
                try:
                    return _fn(*a, **k)
                finally:
                    _b.append(self.clock() - t0)

            setattr(obj, name, timed)

    def table(self, steps: int) -> str:
        return ", ".join(f"{k} {sum(v) / steps * 1e6:.0f} us" for k, v in self.calls.items() if v)


CORE = ["observe", "forced_save", "saved", "mark_emergency"]


def hf_run(out: Path, steps: int, with_callback: bool):
    import realruns
    from transformers import Trainer, TrainerCallback

    from checkpoint_strategy.callbacks import HFCheckpointStrategy

    class Wall(TrainerCallback):
        def __init__(self) -> None:
            self.t = []

        def on_step_begin(self, args, state, control, **kw):
            self.t.append(time.perf_counter())

    wall = Wall()
    timer = Timer()
    callbacks = [wall]
    if with_callback:
        cb = HFCheckpointStrategy(POLICY, handoff_dir=None)
        timer.wrap(cb.core, CORE)
        callbacks.append(cb)
    args = realruns._training_args(out, max_steps=steps, save_steps=10)
    trainer = Trainer(
        model=realruns._tiny_gpt2(),
        args=args,
        train_dataset=realruns._TokenDataset(4096, 16, 64),
        callbacks=callbacks,
    )
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    steps_dt = [b - a for a, b in zip(wall.t, wall.t[1:], strict=False)]
    return timer, statistics.median(steps_dt), total / steps


def lightning_hook_cost(out: Path, steps: int, detect_every: int = 1):
    import callbackruns

    timer = Timer()
    import checkpoint_strategy.callbacks.lightning as L

    orig_init = L.LightningCheckpointStrategy.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        timer.wrap(self.core, CORE)
        timer.wrap(self, ["on_before_optimizer_step"])

    L.LightningCheckpointStrategy.__init__ = init
    try:
        t0 = time.perf_counter()
        _cb, trainer, _m = callbackruns.lightning_train(
            out, POLICY, max_steps=steps, handoff_dir=None, detect_every=detect_every
        )
        total = time.perf_counter() - t0
    finally:
        L.LightningCheckpointStrategy.__init__ = orig_init
    return timer, total / steps


def detector_cost(n: int) -> float:
    import random

    from checkpoint_strategy.callbacks._detector import OnlineDetector

    rng = random.Random(0)
    det = OnlineDetector()
    vals = [(1.0 + 0.02 * rng.random(), 0.5 + 0.05 * rng.random()) for _ in range(n)]
    t0 = time.perf_counter()
    for i, (loss, gn) in enumerate(vals):
        det.update(i, loss, gn)
    return (time.perf_counter() - t0) / n


def report(timer: Timer, steps: int, step_s: float, what: str) -> None:
    """Per logged step (detector, schedule, grad norm) and per save (hand-off to the worker), then the
    share of a 20 ms step at this run's save interval (10) and at a save every 100 steps."""
    per_step = sum(sum(v) for k, v in timer.calls.items() if k != "saved") / steps
    saves = timer.calls.get("saved", [])
    per_save = statistics.median(saves) if saves else 0.0
    mean_save = sum(saves) / len(saves) if saves else 0.0
    print(
        f"  per step: {per_step * 1e6:.0f} us ({timer.table(steps)}); per save: median {per_save * 1e3:.2f} ms, "
        f"mean {mean_save * 1e3:.2f} ms "
    )
    for every in (10, 100):
        cost = per_step + mean_save / every
        print(
            f"  share of a 20 ms step, a save every {every:>3} steps: {cost / STEP_TARGET:6.2%}   (target <= 1%); "
            f"of this run's {step_s * 1e3:.1f} ms step ({what}): {cost / step_s:.2%}"
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_process_run(
    kind: str,
    out: Path,
    steps: int,
    with_callback: bool,
    save_every: int = 10,
    policy: dict | None = None,
    detect_every: int = 1,
    step_sleep: float = 0.0,
    idle_worker: bool = False,
) -> tuple[list[tuple[int, float, float]], dict]:
    """Each step on rank 0 of a 2-process run (tests/multiprocruns.py) as (step, wall seconds, CPU seconds of
    the rank's process, all its threads): the step the interval ends with (a save is made at the end of the
    steps that are multiples of save_every), after the first 5 (start-up); and per rank the callback's own
    time on the training thread and its worker's CPU ({rank: {cpu, wall, calls, by_hook, worker_cpu}})."""
    import json
    import subprocess

    work = out.parent / (out.name + "-work")
    work.mkdir(parents=True)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), str(ROOT / "tests")]),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
    )
    pol = dict(policy or POLICY, keep_milestone=[], frequency=f"every_{save_every}_steps")
    opts = {
        "policy": pol,
        "max_steps": steps,
        "callback": with_callback,
        "save_every": save_every,
        "phase_delay": 0.0,
        "time_hooks": True,
        "detect_every": detect_every,
        "step_sleep": step_sleep,
        "idle_worker": idle_worker,
    }
    argv = [str(ROOT / "tests" / "multiprocruns.py"), kind, str(out), str(work), json.dumps(opts)]
    if kind == "hf":
        argv = [
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            env["MASTER_PORT"],
            *argv,
        ]
    subprocess.run([sys.executable, *argv], env=env, check=True, capture_output=True, timeout=1800)
    ev = [
        e
        for e in map(json.loads, (work / "events-0.jsonl").read_text().splitlines())
        if e["what"] == "step"
    ]
    dt = [
        (b["step"], b["t"] - a["t"], b["cpu"] - a["cpu"]) for a, b in zip(ev, ev[1:], strict=False)
    ][5:]
    hooks = {f.stem: json.loads(f.read_text()) for f in work.glob("hooks-*.json")}
    hooks |= {f.stem: json.loads(f.read_text()) for f in work.glob("threads-*.json")}
    return dt, hooks


AFTER = (
    3  # steps after a save counted apart: the background worker validates then (beside training)
)


def split(
    dt: list[tuple[int, float, float]], save_every: int, col: int = 1
) -> dict[str, list[float]]:
    """Step times (col 1: wall, 2: the rank process's CPU) by kind: 'save' (the step that ends with a save),
    'after' (the AFTER steps after it), 'other' (the rest: the callback's per-step cost alone), 'all'."""
    out: dict[str, list[float]] = {"save": [], "after": [], "other": [], "all": []}
    for row in dt:
        d = row[0] % save_every
        out["save" if d == 0 else "after" if d <= AFTER else "other"].append(row[col])
        out["all"].append(row[col])
    return out


def implied(
    w: dict[str, list[float]],
    wo: dict[str, list[float]],
    save_every: int,
    every: int,
    per_save_more: float = 0.0,
) -> tuple[float, float]:
    """(extra seconds per step, share of the step without the callback) at a save every `every` steps,
    from means: the 'other' steps' extra each step, plus once per save the extra of the save step and of
    the AFTER steps over an 'other' step (and per_save_more: the worker's CPU per save). Conservative: at
    the bench's short interval the worker is still busy during some 'other' steps."""
    m = {
        k: (statistics.fmean(w[k]) - statistics.fmean(wo[k]))
        for k in ("save", "after", "other")
        if w[k] and wo[k]
    }
    per_step = m.get("other", 0.0)
    per_save = (
        m.get("save", 0.0)
        - per_step
        + (m.get("after", per_step) - per_step) * min(AFTER, save_every - 1)
    )
    base = (
        statistics.fmean(wo["other"])
        + (statistics.fmean(wo["save"]) - statistics.fmean(wo["other"])) / every
    )
    extra = per_step + (per_save + per_save_more) / every
    return extra, extra / base


def _kinds(label: str, w: dict[str, list[float]], wo: dict[str, list[float]]) -> None:
    for kind in ("all", "other", "after", "save"):
        a, b = w[kind], wo[kind]
        if a and b:
            print(
                f"  {label} {kind:>5} ({len(a):>3} steps): median {statistics.median(a) * 1e3:6.2f}/"
                f"{statistics.median(b) * 1e3:6.2f} ms = {statistics.median(a) / statistics.median(b):.3f}x, "
                f"mean {statistics.fmean(a) * 1e3:6.2f}/{statistics.fmean(b) * 1e3:6.2f} ms = "
                f"{statistics.fmean(a) / statistics.fmean(b):.3f}x"
            )


def multiproc(
    tmp: Path,
    steps: int,
    pairs: int,
    save_every: int = 10,
    kinds: tuple[str, ...] = ("hf", "pl"),
    detect_every: int = 1,
    step_sleep: float = 0.0,
    idle_worker: bool = False,
) -> None:
    for kind, name in (
        ("hf", "HF Trainer, torchrun --nproc_per_node 2"),
        ("pl", "Lightning DDP, devices=2"),
    ):
        if kind not in kinds:
            continue
        runs = []
        for p in range(pairs):
            w = two_process_run(
                kind,
                tmp / f"mp-{kind}-with-{p}" / "out",
                steps,
                True,
                save_every,
                None,
                detect_every,
                step_sleep,
            )
            wo = two_process_run(
                kind,
                tmp / f"mp-{kind}-without-{p}" / "out",
                steps,
                False,
                save_every,
                step_sleep=step_sleep,
                idle_worker=idle_worker,
            )
            runs.append((w[0], wo[0], w[1] | {"without-" + k: v for k, v in wo[1].items()}))
        print(
            f"{name} (gloo, CPU), {steps} steps x {pairs} pairs, logging every step, detection every "
            f"{1 if kind == 'hf' else detect_every} step(s), a save every "
            f"{save_every} steps, validation in the workers"
            + (
                f", each step waits {step_sleep * 1e3:g} ms with the CPU idle (as a step waiting for its GPU)"
                if step_sleep
                else ", CPU-bound steps (both cores busy training)"
            )
            + "; wall per step on rank 0, with/without:"
        )
        for w, wo, hooks in runs:
            saves = max(1, sum(1 for row in w if row[0] % save_every == 0))
            for col, label in ((1, "wall"), (2, "CPU ")):
                _kinds(label, split(w, save_every, col), split(wo, save_every, col))
            sw, swo = split(w, save_every, 1), split(wo, save_every, 1)
            cw, cwo = split(w, save_every, 2), split(wo, save_every, 2)
            worker = hooks.get("hooks-0", {}).get("worker_cpu", 0.0) / saves
            print(
                f"  rank 0's worker: {worker * 1e3:.1f} ms CPU per save (all its threads, the idle class's included)"
            )
            t_w, t_wo = hooks.get("threads-0", {}), hooks.get("without-threads-0", {})
            if t_w and t_wo:
                print(
                    f"  rank 0's whole run, with/without: main thread {t_w['main']:.2f}/{t_wo['main']:.2f} s CPU, "
                    f"full collections {t_w['gc_count'][2]}/{t_wo['gc_count'][2]} taking "
                    f"{t_w['gc_seconds'][2]:.2f}/{t_wo['gc_seconds'][2]:.2f} s, "
                    f"{t_w['objects']}/{t_wo['objects']} objects tracked at the end"
                )
            for label, a, b, more in (
                ("wall", sw, swo, 0.0),
                ("CPU, rank 0 process + its worker", cw, cwo, worker),
            ):
                print(
                    f"  implied overhead ({label}, means): "
                    + "; ".join(
                        f"a save every {e} steps {implied(a, b, save_every, e, more)[0] * 1e3:.2f} ms/step = "
                        f"{implied(a, b, save_every, e, more)[1]:.2%}"
                        for e in sorted({save_every, 100, 1000})
                    )
                )
            base = statistics.median(swo["other"])
            print(
                "  callback on the training thread per step (of the median 'other' step without it): "
                + "; ".join(
                    f"{r}: CPU {h['cpu'] / steps * 1e6:.0f} us ({h['cpu'] / steps / base:.2%}), wall "
                    f"{h['wall'] / steps * 1e6:.0f} us ({h['wall'] / steps / base:.2%})"
                    for r, h in sorted(hooks.items())
                    if r.startswith("hooks-")
                )
            )
            for r, h in sorted(hooks.items()):
                if not r.startswith("hooks-"):
                    continue
                print(
                    f"    {r} per call, CPU/wall (CPU without the first call, its one-time imports): "
                    + ", ".join(
                        f"{k} x{n} {c / n * 1e6:.0f}/{wl / n * 1e6:.0f} us ({(c - c1) / max(1, n - 1) * 1e6:.0f})"
                        for k, (c, wl, n, c1) in h.get("by_hook", {}).items()
                    )
                )
        if len(runs) > 1:
            pair = sorted(
                statistics.fmean(r[1] for r in w) / statistics.fmean(r[1] for r in wo)
                for w, wo, _h in runs
            )
            print(
                f"  over the {len(runs)} pairs, mean wall step with/without: {', '.join(f'{x:.3f}x' for x in pair)}; "
                f"median {statistics.median(pair):.3f}x (pairs run one after the other: the run-to-run spread is "
                "the noise floor)"
            )


def split_validation(tmp: Path, mb: int) -> None:
    """One process vs two processes (one part each, at the same time) on a 4-shard DCP checkpoint, level full."""
    import subprocess

    import realruns

    width = max(
        64, int((mb * 2**20 / 4 / 4 / 3) ** 0.5)
    )  # 4 layers, float32 weights + 2 Adam moments
    path = realruns.build_dcp_sharded(tmp / "dcp", shards=4, width=width)
    size = sum(f.stat().st_size for f in path.iterdir())
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"))
    cmd = [sys.executable, "-m", "checkpoint_strategy", "validate", str(path), "--format", "json"]
    subprocess.run(
        cmd + ["--level", "full"], env=env, capture_output=True, check=True
    )  # warm the page cache
    one, two, one_in, two_in = [], [], [], []

    def seconds(out: bytes) -> float:
        import json

        return float(json.loads(out)["summary"]["seconds"])

    for _ in range(3):
        t0 = time.perf_counter()
        one_in.append(
            seconds(
                subprocess.run(
                    cmd + ["--level", "full"], env=env, capture_output=True, check=True
                ).stdout
            )
        )
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(cmd + ["--part", f"{k}/2"], env=env, stdout=subprocess.PIPE)
            for k in (1, 2)
        ]
        two_in.append(max(seconds(pr.communicate()[0]) for pr in procs))
        two.append(time.perf_counter() - t0)
    o, t, oi, ti = (statistics.median(x) for x in (one, two, one_in, two_in))
    print(
        f"validation of a 4-shard DCP checkpoint ({size / 2**20:.0f} MB, level full, warm cache): one process "
        f"{oi:.3f} s, two processes one part each {ti:.3f} s (the slower part) = {ti / oi:.2f}x; with the "
        f"process start: {o:.2f} s vs {t:.2f} s = {t / o:.2f}x"
    )


def guard_loop(out: Path, steps: int, sleep: float, with_guard: bool) -> list[float]:
    """Per-step wall times of a plain loop, with or without TrainingGuard (its own save every 50 steps)."""
    import torch

    from checkpoint_strategy.callbacks.guard import TrainingGuard

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = TrainingGuard(out, frequency_steps=50, level="quick") if with_guard else None
    times = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        if guard is not None and guard.skip(step):
            continue
        g = torch.Generator().manual_seed(step)
        x = torch.randn(64, 64, generator=g)
        for pg in opt.param_groups:
            pg["lr"] = 1e-3 * (guard.lr_scale(step) if guard is not None else 1.0)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
        opt.zero_grad()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(
            model.parameters(), (guard.grad_clip(step) if guard else None) or 1e9
        )
        opt.step()
        time.sleep(sleep)  # the GPU's share of the step: the CPU waits
        save = step % 50 == 0
        if guard is not None:
            save = guard.step(step, float(loss.detach()), grad_norm=float(gn)).action == "save"
        if save:
            path = out / f"checkpoint-{step}.pt"
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path
            )
            if guard is not None:
                guard.saved(step, path)
        times.append(time.perf_counter() - t0)
    if guard is not None:
        guard.close()
    return times


def hf_playbook_run(out: Path, steps: int, sleep: float, with_playbook: bool) -> list[float]:
    """Per-step wall times of a tiny HF Trainer run with HFCheckpointStrategy: train vs train_with_recovery."""
    import realruns
    from transformers import Trainer, TrainerCallback

    from checkpoint_strategy.callbacks import HFCheckpointStrategy, train_with_recovery

    marks: list[float] = []

    class Pad(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(sleep)
            marks.append(time.perf_counter())

    args = realruns._training_args(out, max_steps=steps, save_steps=500)
    cb = HFCheckpointStrategy(
        {"frequency": "every_50_steps", "keep_last": 2}, preemption_signals=()
    )
    trainer = Trainer(
        model=realruns._tiny_gpt2(),
        args=args,
        train_dataset=realruns._TokenDataset(4096, 16, 64),
        callbacks=[cb, Pad()],
    )
    if with_playbook:
        train_with_recovery(trainer, level="quick")
    else:
        trainer.train()
    return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def guard_cpu(n: int = 20000) -> float:
    """CPU seconds of the training thread per step in TrainingGuard alone (skip, lr_scale, grad_clip, step)."""
    import math

    from checkpoint_strategy.callbacks.guard import TrainingGuard

    g = TrainingGuard(tempfile.mkdtemp(prefix="bench-guard-"), frequency_steps=10**9)
    t0 = time.thread_time()
    for s in range(1, n + 1):
        g.skip(s)
        g.lr_scale(s)
        g.grad_clip(s)
        g.step(s, 1.0 + 0.01 * math.sin(s), grad_norm=0.5)
    dt = (time.thread_time() - t0) / n
    g.close()
    return dt


def playbook(tmp: Path, steps: int, pairs: int, sleep: float) -> None:
    per = guard_cpu()
    print(
        f"TrainingGuard alone: {per * 1e6:.1f} us CPU a step = {per / sleep:.2%} of a {sleep * 1e3:.0f} ms step"
    )
    for label, run in (
        ("plain loop + TrainingGuard", guard_loop),
        ("HF Trainer: train_with_recovery", hf_playbook_run),
    ):
        w_med, wo_med, w_mean, wo_mean = [], [], [], []
        for p in range(pairs):
            for on in (True, False):
                t = run(tmp / f"pb-{label[:2]}-{p}-{on}", steps, sleep, on)
                (w_med if on else wo_med).append(statistics.median(t))
                (w_mean if on else wo_mean).append(statistics.fmean(t))
        med, mean = statistics.median(w_med) / statistics.median(wo_med), sum(w_mean) / sum(wo_mean)
        print(
            f"{label}, {steps} steps x {pairs} pairs, each step padded {sleep * 1e3:.0f} ms: median step with/without "
            f"{statistics.median(w_med) * 1e3:.2f} / {statistics.median(wo_med) * 1e3:.2f} ms = {med:.4f}x; "
            f"mean (saves included) {mean:.4f}x (target within 1 %)"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument(
        "--no-worker",
        action="store_true",
        help="validate_on_save off and no keep_last: the worker never runs (the callback's own cost)",
    )
    ap.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: the training thread's CPU time in the callback (default); wall: perf_counter",
    )
    ap.add_argument(
        "--multiproc",
        action="store_true",
        help="also the 2-process runs (torchrun, Lightning DDP) and the split validation of a DCP checkpoint",
    )
    ap.add_argument(
        "--dcp-mb", type=int, default=256, help="size of the 4-shard DCP checkpoint (MB)"
    )
    ap.add_argument(
        "--only-multiproc",
        action="store_true",
        help="only the 2-process runs and the split validation",
    )
    ap.add_argument(
        "--kinds", default="hf,pl", help="the 2-process runs to make: hf, pl or both (hf,pl)"
    )
    ap.add_argument(
        "--detect-every", type=int, default=1, help="Lightning's detect_every in the 2-process runs"
    )
    ap.add_argument(
        "--save-every", type=int, default=10, help="save interval (steps) of the 2-process runs"
    )
    ap.add_argument(
        "--step-sleep",
        type=float,
        default=0.0,
        help="seconds each step of the 2-process runs waits with the CPU idle, as a step waiting for its "
        "GPU does (0: CPU-bound steps, the worst case for the background worker)",
    )
    ap.add_argument(
        "--idle-worker-baseline",
        action="store_true",
        help="HF: the runs without the callback start its worker process anyway, idle (a control: what the "
        "worker's mere presence costs)",
    )
    ap.add_argument(
        "--no-split-validation", action="store_true", help="skip the 4-shard DCP split validation"
    )
    ap.add_argument(
        "--playbook",
        action="store_true",
        help="only the recovery playbook's end-to-end cost (TrainingGuard, train_with_recovery); "
        "--step-sleep pads each step (default 0.05 s here)",
    )
    a = ap.parse_args()
    if a.playbook:
        playbook(
            Path(tempfile.mkdtemp(prefix="bench-playbook-")), a.steps, a.pairs, a.step_sleep or 0.05
        )
        return 0
    global CLOCK
    CLOCK = time.thread_time if a.clock == "cpu" else time.perf_counter
    print(
        f"clock: {'CPU time of the training thread (time.thread_time)' if a.clock == 'cpu' else 'wall (perf_counter)'}"
    )
    if a.no_worker:
        POLICY.update(validate_on_save=False, keep_last=None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-callbacks-"))

    if a.only_multiproc:
        multiproc(
            tmp,
            a.steps,
            a.pairs,
            a.save_every,
            tuple(a.kinds.split(",")),
            a.detect_every,
            a.step_sleep,
            a.idle_worker_baseline,
        )
        if not a.no_split_validation:
            split_validation(tmp, a.dcp_mb)
        return 0
    per_update = detector_cost(100_000)
    print(
        f"online detector: {per_update * 1e6:.1f} us per logged step (loss + grad norm, 100000 steps)"
    )

    with_steps, without_steps, runs, means = [], [], [], []
    for p in range(a.pairs):
        timer, med_with, mean_with = hf_run(tmp / f"with-{p}", a.steps, True)
        _t, med_without, mean_without = hf_run(tmp / f"without-{p}", a.steps, False)
        with_steps.append(med_with)
        without_steps.append(med_without)
        means.append(mean_with / mean_without)
        runs.append(timer)
    base = statistics.median(without_steps)
    print(
        f"HF Trainer, {a.steps} steps x {a.pairs} runs, logging every step, a save every 10 steps, "
        f"{'no worker' if a.no_worker else 'validation + prune on the background worker'}:"
    )
    report(runs[len(runs) // 2], a.steps, base, "without the callback")
    print(
        f"  end to end, median step with/without: {statistics.median(with_steps) * 1e3:.1f} / {base * 1e3:.1f} ms "
        f"= {statistics.median(with_steps) / base:.3f}x; mean step (whole run / steps, saves included) "
        f"with/without: {', '.join(f'{m:.3f}x' for m in means)} (shared machine: noisy)"
    )
    if a.multiproc:
        multiproc(
            tmp,
            a.steps,
            a.pairs,
            a.save_every,
            tuple(a.kinds.split(",")),
            a.detect_every,
            a.step_sleep,
            a.idle_worker_baseline,
        )
        if not a.no_split_validation:
            split_validation(tmp, a.dcp_mb)
    for every in (1, 10):
        timer, step_s = lightning_hook_cost(tmp / f"pl-{every}" / "ckpts", a.steps, every)
        print(
            f"Lightning, {a.steps} steps, detection (and grad norm) every {every} step(s), a save every 10 steps:"
        )
        report(timer, a.steps, step_s, "with the callback")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
