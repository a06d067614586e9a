"""The recovery playbook, computed for one run: keep training, or where to resume and how."""

from __future__ import annotations

import math
import os
from typing import Any, Optional, Union
from collections.abc import Sequence

import numpy as np

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.recovery import ckptsteps, detect
from checkpoint_strategy.recovery.logs import Columns, LogSeries, build_series, read_log
from checkpoint_strategy.recovery.models import (
    CheckpointRef,
    CheckpointsInfo,
    LogInfo,
    Overrides,
    RecoveryReport,
    Restart,
    Spike,
    Thresholds,
)

CheckpointsArg = Union[None, str, os.PathLike, Sequence[Union[int, tuple]]]
SMOOTH_CHECKPOINT_POINTS = 11   # losses around a checkpoint whose median is its "smoothed loss"
PRECURSOR_POINTS = 5            # a grad-norm spike this many logged values before a loss onset leads it


def _fin(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _check_options(window, z_threshold, ratio_threshold, max_ratio, min_rise, tolerance, wait_steps,
                   min_wait_steps, margin, lr_multiplier, lr_reduced_steps, grad_clip, skip_past_onset) -> None:
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise UsageError(msg)

    need(isinstance(window, int) and 8 <= window <= 10**6, f"--window must be a whole number 8..1000000, got {window!r}")
    for name, v, lo, hi in (("--z", z_threshold, 1.0, 1e6), ("--ratio", ratio_threshold, 1.0, 1e6),
                            ("--max-ratio", max_ratio, 1.0, 1e6), ("--min-rise", min_rise, 0.0, 100.0),
                            ("--tolerance", tolerance, 0.0, 100.0), ("--lr-multiplier", lr_multiplier, 0.0, 1.0),
                            ("--grad-clip", grad_clip, 0.0, 1e6)):
        fv = _fin(v)
        need(fv is not None and lo <= fv <= hi and not (name in ("--lr-multiplier", "--grad-clip") and fv <= 0),
             f"{name} must be a number in ({lo}, {hi}], got {v!r}")
    for name, v in (("--wait", wait_steps), ("--min-wait", min_wait_steps), ("--lr-steps", lr_reduced_steps),
                    ("--skip-past-onset", skip_past_onset)):
        need(isinstance(v, int) and 0 <= v <= 10**12, f"{name} must be a whole number >= 0, got {v!r}")
    need(min_wait_steps <= wait_steps, f"--min-wait ({min_wait_steps}) must not exceed --wait ({wait_steps})")
    need(margin is None or (isinstance(margin, int) and 0 <= margin <= 10**12),
         f"--margin must be a whole number >= 0, got {margin!r}")


def _checkpoint_list(checkpoints: CheckpointsArg, log_path) -> tuple[str, Optional[str], list[tuple[int, Optional[str]]]]:
    if checkpoints is None:
        return ckptsteps.auto_discover(log_path) if log_path is not None else ("none", None, [])
    if isinstance(checkpoints, (str, os.PathLike)):
        return ckptsteps.parse_spec(str(checkpoints))
    out = []
    for item in checkpoints:
        if isinstance(item, tuple):
            step, path = int(item[0]), (None if item[1] is None else str(item[1]))
        else:
            step, path = int(item), None
        if step < 0:
            raise UsageError(f"checkpoint step {step} is negative")
        out.append((step, path))
    return "list", None, sorted(set(out), key=lambda t: t[0])


def _milestone_list(milestones) -> list[tuple[int, Optional[str]]]:
    if milestones is None:
        return []
    if isinstance(milestones, (str, os.PathLike)):
        return ckptsteps.parse_spec(str(milestones))[2]
    return _checkpoint_list(list(milestones), None)[2]


def spikes_of(series: LogSeries, *, window: int = detect.DEFAULT_WINDOW, z_threshold: float = detect.DEFAULT_Z,
              ratio_threshold: float = detect.DEFAULT_RATIO, max_ratio: float = detect.DEFAULT_MAX_RATIO,
              min_rise: float = detect.DEFAULT_MIN_RISE, tolerance: float = detect.DEFAULT_TOLERANCE) -> list[Spike]:
    """Every event of a series as Spike models: loss events, and grad-norm events with no loss event."""
    kw = dict(window=window, z_threshold=z_threshold, ratio_threshold=ratio_threshold, max_ratio=max_ratio,
              min_rise=min_rise, tolerance=tolerance)
    loss_events = detect.find_events(series.loss, **kw)
    grad_events = detect.find_events(series.grad_norm, grad=True, **kw) if series.grad_norm is not None else []
    used = set()
    for ev in loss_events:
        for gi, g in enumerate(grad_events):
            if ev.onset - PRECURSOR_POINTS <= g.onset <= ev.onset:
                used.add(gi)
                if g.onset < ev.onset:
                    ev.precursor = g.onset
            elif ev.onset < g.onset <= (ev.end if ev.end is not None else len(series.steps)):
                used.add(gi)  # grad norm blew up inside the loss event: part of it
    events = list(loss_events) + [g for gi, g in enumerate(grad_events) if gi not in used]
    events.sort(key=lambda e: e.onset)
    return [_spike(series, e) for e in events]


def _spike(series: LogSeries, ev: detect.Event) -> Spike:
    steps, loss = series.steps, series.loss
    n = len(steps)
    onset = ev.precursor if ev.precursor is not None else ev.onset
    end = ev.end if ev.end is not None else n
    span = slice(onset, max(end, ev.peak + 1))
    if ev.kind == "grad_norm":
        seg = loss[span]
        fin = np.isfinite(seg)
        peak_idx = ev.peak
        peak_loss = _fin(loss[peak_idx])
        pre = loss[max(0, onset - detect.BASELINE_POINTS):onset]
        pre = pre[np.isfinite(pre)]
        baseline = _fin(np.median(pre)) if len(pre) else None
        z = None
        del seg, fin
    else:
        peak_idx = ev.peak
        peak_loss = _fin(loss[peak_idx])
        baseline = _fin(ev.baseline)
        z = _fin(ev.z_peak)
    magnitude = None
    if peak_loss is not None and baseline is not None and baseline > 0:
        magnitude = _fin(round(peak_loss / baseline, 4))
    peak_gn = base_gn = None
    if series.grad_norm is not None:
        g = series.grad_norm[span]
        g = g[np.isfinite(g)]
        peak_gn = _fin(g.max()) if len(g) else None
        gp = series.grad_norm[max(0, onset - detect.BASELINE_POINTS):onset]
        gp = gp[np.isfinite(gp)]
        base_gn = _fin(np.median(gp)) if len(gp) else None
    recovered = int(steps[ev.end]) if ev.end is not None else None
    return Spike(
        kind=ev.kind, onset_step=int(steps[onset]), peak_step=int(steps[peak_idx]), peak_loss=peak_loss,
        baseline_loss=baseline, magnitude=magnitude, z_score=None if z is None else round(z, 2),
        recovered_step=recovered, recovery_steps=None if recovered is None else recovered - int(steps[onset]),
        detected_by=list(ev.rules), peak_grad_norm=peak_gn, baseline_grad_norm=base_gn,
        grad_norm_precursor_step=int(steps[ev.precursor]) if ev.precursor is not None else None)


def detect_spikes(steps, loss, grad_norm=None, *, window: int = detect.DEFAULT_WINDOW,
                  z_threshold: float = detect.DEFAULT_Z, ratio_threshold: float = detect.DEFAULT_RATIO,
                  max_ratio: float = detect.DEFAULT_MAX_RATIO, min_rise: float = detect.DEFAULT_MIN_RISE,
                  tolerance: float = detect.DEFAULT_TOLERANCE) -> list[Spike]:
    """Spikes in raw arrays (file order; restarts are merged, latest segment wins). Oldest first.

    steps: whole numbers >= 0; loss: floats (NaN/inf allowed: critical events); grad_norm: optional,
    NaN where not logged. Thresholds as in `checkpoint_strategy.recovery.detect`. Raises UsageError
    on bad input.
    """
    _check_options(window, z_threshold, ratio_threshold, max_ratio, min_rise, tolerance, 100, 50, None, 0.5, 500,
                   0.5, 20)
    series = build_series(steps, loss, grad_norm, grad_norm_key="grad_norm" if grad_norm is not None else None)
    return spikes_of(series, window=window, z_threshold=z_threshold, ratio_threshold=ratio_threshold,
                     max_ratio=max_ratio, min_rise=min_rise, tolerance=tolerance)


def advise(log_path, checkpoints: CheckpointsArg = None, *, milestones=None, log_format: str = "auto",
           step_key: Optional[str] = None, loss_key: Optional[str] = None, grad_norm_key: Optional[str] = None,
           lr_key: Optional[str] = None, run: Optional[str] = None, window: int = detect.DEFAULT_WINDOW,
           z_threshold: float = detect.DEFAULT_Z, ratio_threshold: float = detect.DEFAULT_RATIO,
           max_ratio: float = detect.DEFAULT_MAX_RATIO, min_rise: float = detect.DEFAULT_MIN_RISE,
           tolerance: float = detect.DEFAULT_TOLERANCE, wait_steps: int = 100, min_wait_steps: int = 50,
           margin: Optional[int] = None, lr_multiplier: float = 0.5, lr_reduced_steps: int = 500,
           grad_clip: float = 0.5, skip_past_onset: int = 20) -> RecoveryReport:
    """Read a training log, find loss spikes and compute the recovery playbook for the latest one.

    Stable API (used by the training-stability-monitor integration):

    log_path       a trainer_state.json, CSV (W&B export too), JSON/JSON lines file, TensorBoard
                   events file or folder, or a run/checkpoint folder (newest trainer_state.json).
    checkpoints    None: found next to the log (the log's folder, or the run folder above a
                   checkpoint-N folder); a folder path; a string "500,1000"; or a sequence of steps
                   or (step, path) tuples.
    milestones     extra long-kept checkpoints (same forms); used as resume points too, and named
                   when no checkpoint predates the spike.
    step_key/loss_key/grad_norm_key/lr_key   column, key or TensorBoard tag names (default: common
                   names such as step/_step/global_step and loss/train/loss/lm loss).
    run            W&B export with several runs: which one.
    window, z_threshold, ratio_threshold, max_ratio, min_rise   detection, see recovery.detect.
    tolerance      0.10: "back near baseline" and the resume checkpoint's smoothed loss must be
                   within this fraction of the pre-spike level (the spec's spike_value * 1.1).
    wait_steps, min_wait_steps   the spec's 50-100-step wait window.
    margin         a resume checkpoint must be at or before onset - margin; default: one logging
                   interval + 1 (checkpoint N holds the weights that produce the loss logged at
                   N + 1, so checkpoint onset-1 already contains the spike).
    lr_multiplier, lr_reduced_steps, grad_clip, skip_past_onset   the playbook's numbers.

    Returns a RecoveryReport (pydantic; `.model_dump(mode="json")` for JSON). Raises
    checkpoint_strategy.errors.UsageError (one line) on bad input; never loads a checkpoint.
    """
    _check_options(window, z_threshold, ratio_threshold, max_ratio, min_rise, tolerance, wait_steps,
                   min_wait_steps, margin, lr_multiplier, lr_reduced_steps, grad_clip, skip_past_onset)
    series = read_log(log_path, log_format=log_format,
                      columns=Columns(step=step_key, loss=loss_key, grad_norm=grad_norm_key, lr=lr_key, run=run))
    ck_source, ck_root, ck_list = _checkpoint_list(checkpoints, series.path if log_path is None else log_path)
    miles = _milestone_list(milestones)
    return advise_series(series, ck_list, checkpoints_source=ck_source, checkpoints_root=ck_root,
                         milestones=miles, window=window, z_threshold=z_threshold,
                         ratio_threshold=ratio_threshold, max_ratio=max_ratio, min_rise=min_rise,
                         tolerance=tolerance, wait_steps=wait_steps, min_wait_steps=min_wait_steps, margin=margin,
                         lr_multiplier=lr_multiplier, lr_reduced_steps=lr_reduced_steps, grad_clip=grad_clip,
                         skip_past_onset=skip_past_onset)


def log_info(series: LogSeries) -> LogInfo:
    return LogInfo(path=series.path, format=series.format, step_key=series.step_key, loss_key=series.loss_key,
                   grad_norm_key=series.grad_norm_key, lr_key=series.lr_key, entries=series.entries,
                   points=len(series.steps), first_step=int(series.steps[0]), last_step=int(series.steps[-1]),
                   log_interval=series.log_interval)


def _smoothed_loss(series: LogSeries, step: int, onset_idx: int) -> Optional[float]:
    """Median of the losses logged up to and including the first one after `step` (the first loss
    those weights produce), never reaching the onset."""
    steps = series.steps
    after = int(np.searchsorted(steps, step, side="right"))
    if after >= len(steps):
        return None
    interval = series.log_interval
    if steps[after] - step > 2 * interval and after == 0:
        return None
    hi = min(after + 1, onset_idx)
    lo = max(0, hi - SMOOTH_CHECKPOINT_POINTS)
    vals = series.loss[lo:hi]
    vals = vals[np.isfinite(vals)]
    return _fin(np.median(vals)) if len(vals) else None


def _interval_before(series: LogSeries, idx: int) -> int:
    seg = series.steps[max(0, idx - detect.BASELINE_POINTS):idx + 1]
    if len(seg) < 2:
        return series.log_interval
    return max(1, int(np.median(np.diff(seg))))


def overrides(resume_path: Optional[str], resume_step: int, skip: list[int], lr_multiplier: float,
              lr_steps: int, grad_clip: float) -> Overrides:
    """Ready-to-paste HF Trainer and Lightning code for this resume."""
    path = resume_path if resume_path is not None else f"<checkpoint of step {resume_step}>"
    lr_lo, lr_hi = resume_step + 1, resume_step + lr_steps
    s0, s1 = skip
    scale = (
        f"    def _scale(self, optimizer, factor):\n"
        f"        if {lr_lo} <= self.step <= {lr_hi}:\n"
        f"            for group in optimizer.param_groups:\n"
        f"                group[\"lr\"] *= factor\n"
    )
    hooks = (
        f"            opt.register_step_pre_hook(lambda o, a, k: self._scale(o, {lr_multiplier!r}))\n"
        f"            opt.register_step_post_hook(lambda o, a, k: self._scale(o, 1 / {lr_multiplier!r}))\n"
    )
    hf = (
        f"# Hugging Face Trainer: resume from step {resume_step} with the recovery playbook\n"
        f"from transformers import TrainerCallback\n\n"
        f"class SpikeRecovery(TrainerCallback):\n"
        f'    """LR x{lr_multiplier:g} for optimizer steps {lr_lo}-{lr_hi}, on top of the schedule."""\n'
        f"    step = 0\n"
        f"    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):\n"
        f"        for opt in [getattr(optimizer, 'optimizer', optimizer)]:  # unwrap accelerate's wrapper\n"
        + hooks +
        "    def on_step_begin(self, args, state, control, **kwargs):\n"
        "        self.step = state.global_step + 1\n"
        + scale +
        f"\n"
        f"training_args.max_grad_norm = {grad_clip!r}   # tighter clipping (was 1.0)\n"
        f"# HF Trainer cannot skip a step range: reshuffle instead, so steps {s0}-{s1} see other batches\n"
        f"training_args.data_seed = (training_args.data_seed or training_args.seed) + 1\n"
        f"trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset,\n"
        f"                  callbacks=[SpikeRecovery()])\n"
        f"trainer.train(resume_from_checkpoint={path!r})\n"
    )
    lightning = (
        f"# PyTorch Lightning: resume from step {resume_step} with the recovery playbook\n"
        f"import pytorch_lightning as pl\n\n"
        f"class SpikeRecovery(pl.Callback):\n"
        f'    """LR x{lr_multiplier:g} for optimizer steps {lr_lo}-{lr_hi}, on top of the schedule."""\n'
        f"    step = 0\n"
        f"    def on_train_start(self, trainer, pl_module):\n"
        f"        for opt in trainer.optimizers:\n"
        + hooks +
        "    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):\n"
        "        self.step = trainer.global_step + 1\n"
        + scale +
        f"\n"
        f"# In your LightningModule.training_step, skip the batches of steps {s0}-{s1}\n"
        f"# (assumes one batch per optimizer step and a data loader that resumes in place):\n"
        f"#     self._batch = getattr(self, '_batch', {resume_step}) + 1\n"
        f"#     if {s0} <= self._batch <= {s1}:\n"
        f"#         return None   # no optimizer step for this batch\n"
        f"trainer = pl.Trainer(..., gradient_clip_val={grad_clip!r}, callbacks=[SpikeRecovery()])\n"
        f"trainer.fit(model, datamodule=datamodule, ckpt_path={path!r})\n"
    )
    return Overrides(hf_trainer=hf, lightning=lightning)


def advise_series(series: LogSeries, checkpoints: list[tuple[int, Optional[str]]], *,  # noqa: C901 - complexity debt, see issue 10
                  checkpoints_source: str = "list", checkpoints_root: Optional[str] = None,
                  milestones: Optional[list[tuple[int, Optional[str]]]] = None,
                  window: int = detect.DEFAULT_WINDOW, z_threshold: float = detect.DEFAULT_Z,
                  ratio_threshold: float = detect.DEFAULT_RATIO, max_ratio: float = detect.DEFAULT_MAX_RATIO,
                  min_rise: float = detect.DEFAULT_MIN_RISE, tolerance: float = detect.DEFAULT_TOLERANCE,
                  wait_steps: int = 100, min_wait_steps: int = 50, margin: Optional[int] = None,
                  lr_multiplier: float = 0.5, lr_reduced_steps: int = 500, grad_clip: float = 0.5,
                  skip_past_onset: int = 20) -> RecoveryReport:
    """`advise` on an already-read LogSeries and checkpoint list."""
    milestones = milestones or []
    spikes = spikes_of(series, window=window, z_threshold=z_threshold, ratio_threshold=ratio_threshold,
                       max_ratio=max_ratio, min_rise=min_rise, tolerance=tolerance)
    thresholds = Thresholds(window=window, z_threshold=z_threshold, ratio_threshold=ratio_threshold,
                            max_ratio=max_ratio, min_rise=min_rise, tolerance=tolerance, wait_steps=wait_steps,
                            min_wait_steps=min_wait_steps)
    restarts = [Restart(**r) for r in series.restarts]
    steps = series.steps
    last_step = int(steps[-1])
    ck_steps = [s for s, _ in checkpoints]
    ck_info = CheckpointsInfo(source=checkpoints_source if checkpoints else "none", root=checkpoints_root,
                              count=len(checkpoints), first_step=min(ck_steps) if ck_steps else None,
                              last_step=max(ck_steps) if ck_steps else None)
    warnings: list[str] = []
    reasons: list[str] = []
    if restarts:
        shown = ", ".join(f"{r.previous_step}->{r.step}" for r in restarts[:5])
        more = f" and {len(restarts) - 5} more" if len(restarts) > 5 else ""
        reasons.append(f"the log restarts {len(restarts)} time(s) ({shown}{more}); the latest segment wins "
                       "for repeated steps")
    common = dict(log=log_info(series), spikes=spikes, checkpoints=ck_info, restarts=restarts,
                  thresholds=thresholds, warnings=warnings, reasons=reasons)
    loss_spikes = [s for s in spikes if s.kind != "grad_norm"]
    if not spikes:
        return RecoveryReport(status="no_spike", summary=f"no loss spike in {len(steps)} logged steps "
                              f"({int(steps[0])}-{last_step}): keep training", spike=None, self_recovered=None,
                              wait_until_step=None, resume_checkpoint=None, skip_batches=None, lr_multiplier=None,
                              lr_reduced_steps=None, grad_clip=None, **common)
    if not loss_spikes:
        spike = spikes[-1]
        done = spike.recovered_step is not None
        base_l, peak_l = spike.baseline_loss, spike.peak_loss
        rose = (base_l is not None and peak_l is not None and math.isfinite(peak_l) and base_l > 0
                and peak_l > base_l * (1 + tolerance))
        if rose:  # early in training the rolling median is still high, so the loss rules may not fire
            reasons.append(f"grad norm spiked at step {spike.onset_step} (peak {spike.peak_grad_norm} vs median "
                           f"{spike.baseline_grad_norm}); the loss rose to {_show(peak_l)} ({peak_l / base_l:.2f}x "
                           f"its median {_show(base_l)}) without crossing the loss-spike thresholds")
            loss_words = "loss rise below the spike thresholds"
        else:
            reasons.append(f"grad norm spiked at step {spike.onset_step} (peak {spike.peak_grad_norm} vs median "
                           f"{spike.baseline_grad_norm}) but the loss stayed near its baseline")
            loss_words = "loss unaffected"
        return RecoveryReport(status="self_recovered" if done else "wait",
                              summary=f"grad-norm spike at step {spike.onset_step}, {loss_words}: keep training"
                              + ("" if done else " and watch the grad norm and loss"),
                              spike=spike, self_recovered=done, wait_until_step=spike.onset_step + wait_steps,
                              resume_checkpoint=None, skip_batches=None, lr_multiplier=None, lr_reduced_steps=None,
                              grad_clip=None, **common)
    spike = loss_spikes[-1]
    onset = spike.onset_step
    onset_idx = int(np.searchsorted(steps, onset))
    base = spike.baseline_loss
    wait_until = onset + wait_steps
    critical = spike.kind == "nonfinite"
    level = None if base is None else base + tolerance * abs(base)
    reasons.append(f"loss spike at step {onset}: peak {_show(spike.peak_loss)} at step {spike.peak_step} vs "
                   f"pre-spike level {_show(base)}" + (f" ({spike.magnitude:.3g}x)" if spike.magnitude else "")
                   + f"; detected by {'; '.join(spike.detected_by) or 'the rolling baseline'}")
    if spike.grad_norm_precursor_step is not None:
        reasons.append(f"the grad norm spiked first, at step {spike.grad_norm_precursor_step}: onset moved there")

    if spike.recovered_step is not None:
        took = spike.recovery_steps or 0
        if took <= wait_steps:
            reasons.append(f"the loss was back within {tolerance:.0%} of the pre-spike level by step "
                           f"{spike.recovered_step}, {took} steps after the onset (inside the {min_wait_steps}-"
                           f"{wait_steps}-step wait window): the optimizer absorbed it")
        else:
            warnings.append(f"the loss took {took} steps to come back (longer than the {wait_steps}-step wait "
                            "window); no rollback needed now, but compare evals before and after the spike")
            reasons.append(f"the loss is back near the pre-spike level since step {spike.recovered_step}")
        return RecoveryReport(status="self_recovered", summary=f"loss spike at step {onset} recovered by step "
                              f"{spike.recovered_step}: keep training", spike=spike, self_recovered=True,
                              wait_until_step=wait_until, resume_checkpoint=None, skip_batches=None,
                              lr_multiplier=None, lr_reduced_steps=None, grad_clip=None, **common)

    elapsed = last_step - onset
    waiting = (not critical) and elapsed < wait_steps
    projected = None
    if waiting and elapsed >= min_wait_steps and base is not None:
        projected = _projected_excess(series, onset_idx, base, wait_until)
        if projected is not None and projected > tolerance * abs(base):
            waiting = False
    if critical:
        reasons.append("the loss is NaN/inf: it does not come back on its own, roll back now")
    elif waiting:
        reasons.append(f"only {elapsed} steps since the onset: the spec says wait {min_wait_steps}-{wait_steps} "
                       f"steps before rolling back; the plan below is ready if it is still above "
                       f"{_show(level)} at step {wait_until}")
    elif projected is not None:
        reasons.append(f"{elapsed} steps after the onset (past the {min_wait_steps}-step minimum wait) the loss is "
                       f"still {_show(float(np.median(series.loss[-detect.SMOOTH_POINTS:])))}; at its current rate "
                       f"of decay it would still be {_show(projected)} above the pre-spike level at step "
                       f"{wait_until}, more than the {tolerance:.0%} tolerance: roll back now")
    else:
        reasons.append(f"not back within {tolerance:.0%} of the pre-spike level {elapsed} steps after the onset "
                       f"(last step {last_step}; wait window {wait_steps})")

    # the resume checkpoint
    interval = _interval_before(series, onset_idx)
    mg = margin if margin is not None else interval + 1
    cutoff = onset - mg
    ck_info.cutoff_step, ck_info.margin_steps = cutoff, mg
    earlier = [s for s in spikes if s.onset_step < onset and s.kind != "grad_norm"]
    cands = [(s, p, "checkpoint") for s, p in checkpoints] + [(s, p, "milestone") for s, p in milestones]
    cands = sorted({(s, p, k) for s, p, k in cands if s <= cutoff}, key=lambda t: (-t[0], t[2]))

    def inside_earlier(s: int) -> bool:
        return any(e.onset_step - mg < s < (e.recovered_step if e.recovered_step is not None else math.inf)
                   for e in earlier)

    chosen: Optional[CheckpointRef] = None
    fallback: Optional[CheckpointRef] = None
    for s, p, kind in cands:
        if inside_earlier(s):
            continue
        sm = _smoothed_loss(series, s, onset_idx)
        ok = None if (sm is None or level is None) else bool(sm <= level)
        ref = CheckpointRef(step=s, path=p, kind=kind, smoothed_loss=sm, within_tolerance=ok)
        if ok:
            chosen = ref
            break
        if fallback is None:
            fallback = ref
    if chosen is None and fallback is not None:
        chosen = fallback
        warnings.append(f"no checkpoint at or before step {cutoff} has a smoothed loss within {tolerance:.0%} of the "
                        f"pre-spike level {_show(base)}; step {chosen.step} is the newest clean candidate "
                        f"(smoothed loss {_show(chosen.smoothed_loss)})")
    nearest = None
    if milestones:
        m = min(milestones, key=lambda t: (abs(t[0] - cutoff), t[0]))
        nearest = CheckpointRef(step=m[0], path=m[1], kind="milestone",
                                smoothed_loss=_smoothed_loss(series, m[0], onset_idx) if m[0] <= cutoff else None)

    status = "wait" if waiting else "rollback"
    policy = None
    if chosen is None:
        skip = None
        if not checkpoints and not milestones:
            warnings.append("no checkpoints given or found next to the log: pass --checkpoints ROOT or a list "
                            "such as 500,1000")
            summary = (f"loss spike at step {onset} not recovered: resume from the newest checkpoint at or before "
                       f"step {cutoff} (none given)")
        else:
            if not waiting:
                status = "no_clean_checkpoint"
            policy = _policy_advice(ck_steps, cutoff, last_step, onset, wait_steps)
            oldest = min(ck_steps) if ck_steps else None
            reasons.append(f"no checkpoint predates the spike: the resume point must be at or before step {cutoff} "
                           f"(onset {onset} - margin {mg})" + (f", but the oldest kept is step {oldest}"
                                                               if oldest is not None else ""))
            if nearest is not None:
                reasons.append(f"nearest milestone: step {nearest.step}" + (f" ({nearest.path})" if nearest.path else ""))
            summary = (f"loss spike at step {onset} not recovered and no checkpoint predates it: "
                       + ("restart from the nearest milestone or from scratch" if nearest is None or nearest.step > cutoff
                          else f"use milestone {nearest.step}"))
        return RecoveryReport(status=status, summary=summary, spike=spike, self_recovered=False,
                              wait_until_step=wait_until, resume_checkpoint=None, nearest_milestone=nearest,
                              skip_batches=skip, lr_multiplier=lr_multiplier, lr_reduced_steps=lr_reduced_steps,
                              grad_clip=grad_clip, policy_advice=policy, **common)

    r = chosen.step
    skip = [r + 1, onset + skip_past_onset]
    reasons.append(f"resume from step {r}: the newest checkpoint at or before step {cutoff} (onset {onset} - margin "
                   f"{mg}; checkpoint N holds the weights whose loss is logged at N+1)"
                   + (f" with smoothed loss {_show(chosen.smoothed_loss)} <= {_show(level)} (pre-spike level "
                      f"{_show(base)} + {tolerance:.0%})" if chosen.within_tolerance else ""))
    skipped_newer = [s for s in ck_steps if cutoff < s]
    if skipped_newer:
        reasons.append(f"checkpoints {_steps_text(skipped_newer)} are at or after the spike: do not resume from them")
    reasons.append(f"then: LR x{lr_multiplier:g} for steps {r + 1}-{r + lr_reduced_steps}, skip or reshuffle the "
                   f"batches of steps {skip[0]}-{skip[1]} ({skip[1] - skip[0] + 1} batches; PaLM skipped ~200-500), "
                   f"gradient clipping {grad_clip:g} instead of 1.0")
    where = chosen.path or f"step {r}"
    summary = (f"loss spike at step {onset} not recovered: resume from {where}" if not waiting else
               f"loss spike at step {onset}: keep training until step {wait_until}; if not back below "
               f"{_show(level)}, resume from {where}")
    return RecoveryReport(status=status, summary=summary, spike=spike, self_recovered=False,
                          wait_until_step=wait_until, resume_checkpoint=chosen, nearest_milestone=nearest,
                          skip_batches=skip, lr_multiplier=lr_multiplier, lr_reduced_steps=lr_reduced_steps,
                          lr_reduced_until_step=r + lr_reduced_steps, grad_clip=grad_clip,
                          overrides=overrides(chosen.path, r, skip, lr_multiplier, lr_reduced_steps, grad_clip),
                          **common)


def _projected_excess(series: LogSeries, onset_idx: int, base: float, until_step: int) -> Optional[float]:
    """Excess loss over the baseline projected to `until_step`, assuming it keeps decaying at the
    exponential rate seen over the last (up to) 50 logged values; None if it cannot be estimated."""
    seg_s = series.steps[onset_idx:][-50:]
    seg_x = series.loss[onset_idx:][-50:]
    if len(seg_x) < 2 * detect.SMOOTH_POINTS or not np.isfinite(seg_x).all():
        return None
    k = detect.SMOOTH_POINTS
    e1 = float(np.median(seg_x[:k])) - base
    e2 = float(np.median(seg_x[-k:])) - base
    dt = float(np.median(seg_s[-k:]) - np.median(seg_s[:k]))
    if e2 <= 0:
        return 0.0
    rate = math.log(e1 / e2) / dt if (e1 > e2 and dt > 0) else 0.0
    remaining = max(0.0, float(until_step - series.steps[-1]))
    return e2 * math.exp(-rate * remaining)


def _policy_advice(ck_steps: list[int], cutoff: int, last_step: int, onset: int, wait_steps: int) -> str:
    span = max(1, last_step - cutoff)
    if len(ck_steps) >= 2:
        freq = max(1, int(np.median(np.diff(sorted(ck_steps)))))
        need = math.ceil(span / freq) + 1
        return (f"the rolling window rotated past the spike: {len(ck_steps)} checkpoints every {freq} steps cover "
                f"{max(ck_steps) - min(ck_steps)} steps, but rolling back needs {span} (detection at step {last_step} "
                f"minus resume point {cutoff}). Keep at least {need} (keep_last >= {need}) so the window spans the "
                f"{wait_steps}-step wait window plus the time to notice, and keep milestones so an older clean "
                "point always survives")
    return (f"only {len(ck_steps)} checkpoint(s) kept: keep a rolling window spanning at least {span} steps "
            f"(the {wait_steps}-step wait window plus the time to notice) and milestones")


def _steps_text(steps: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" and {len(steps) - limit} more" if len(steps) > limit else "")


def _show(v: Optional[float]) -> str:
    if v is None:
        return "NaN/inf"
    from checkpoint_strategy.render import fmt_num

    return fmt_num(v, 4 if abs(v) < 10 else 2)
