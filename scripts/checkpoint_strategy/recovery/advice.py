"""The recovery playbook, computed for one run: keep training, or where to resume and how."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.formats import identify as fm
from checkpoint_strategy.formats import runfacts
from checkpoint_strategy.formats.runlog import find_run_checkpoints, run_facts
from checkpoint_strategy.formats.steps import parse_step
from checkpoint_strategy.planning.planner import milestone_steps
from checkpoint_strategy.recovery import ckptsteps, detect, records, settings
from checkpoint_strategy.recovery.logs import Columns, LogSeries, build_series, read_log
from checkpoint_strategy.recovery.models import (
    CheckpointRef,
    CheckpointsInfo,
    EvalOpinion,
    LogInfo,
    Overrides,
    RecoveryReport,
    Restart,
    Spike,
    Thresholds,
)
from checkpoint_strategy.recovery.settings import RecoveryOptions
from checkpoint_strategy.render import fmt_num, render_template

CheckpointsArg = Union[None, str, os.PathLike, Sequence[Union[int, tuple]]]
SMOOTH_CHECKPOINT_POINTS = 11  # losses around a checkpoint whose median is its "smoothed loss"
LR_CAUSE_STEPS = 2000  # an LR restart this close before an onset is named as its likely cause
# how reasons and summaries name each kind of event
KIND_WORDS = {
    "spike": "loss spike",
    "divergence": "divergence",
    "level_shift": "level shift",
    "nonfinite": "NaN/inf loss",
    "collapse": "collapse",
}


def _fin(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _checkpoint_list(
    checkpoints: CheckpointsArg, log_path
) -> tuple[str, Optional[str], list[tuple[int, Optional[str]]]]:
    if checkpoints is None:
        return find_run_checkpoints(log_path) if log_path is not None else ("none", None, [])
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
    return "list", None, sorted(set(ckptsteps.resume_candidates(out)), key=lambda t: t[0])


def _milestone_list(milestones) -> list[tuple[int, Optional[str]]]:
    if milestones is None:
        return []
    if isinstance(milestones, (str, os.PathLike)):
        return ckptsteps.parse_spec(str(milestones))[2]
    return _checkpoint_list(list(milestones), None)[2]


def analysis_of(series: LogSeries, options: RecoveryOptions) -> detect.Analysis:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return detect.analyse(series.steps, series.loss, series.grad_norm, options, lr=series.lr)


def spikes_of(
    series: LogSeries, options: Optional[RecoveryOptions] = None, **values
) -> list[Spike]:
    """Every event of a series as Spike models, oldest first (see recovery.detect for the kinds)."""
    o = settings.build(options, **values)
    an = analysis_of(series, o)
    return [_spike(series, e, an, o) for e in an.events]


def _spike(series: LogSeries, ev: detect.Event, an: detect.Analysis, o: RecoveryOptions) -> Spike:
    steps, loss = series.steps, series.loss
    n = len(steps)
    onset = ev.precursor if ev.precursor is not None else ev.onset
    end = ev.end if ev.end is not None else n
    span = slice(onset, max(end, ev.peak + 1))
    peak_loss = _fin(loss[ev.peak])
    if ev.kind == "grad_norm":
        pre = loss[max(0, onset - detect.BASELINE_POINTS) : onset]
        pre = pre[np.isfinite(pre)]
        baseline = _fin(np.median(pre)) if len(pre) else None
        z = None
    else:
        baseline = _fin(ev.baseline)
        z = _fin(ev.z_peak)
    reference = _fin(ev.reference) if ev.kind != "grad_norm" else None
    magnitude = None
    if peak_loss is not None and baseline is not None and baseline > 0:
        magnitude = _fin(round(peak_loss / baseline, 4))
    peak_gn = base_gn = None
    if series.grad_norm is not None:
        g = series.grad_norm[span]
        g = g[np.isfinite(g)]
        peak_gn = _fin(g.max()) if len(g) else None
        gp = series.grad_norm[max(0, onset - detect.BASELINE_POINTS) : onset]
        gp = gp[np.isfinite(gp)]
        base_gn = _fin(np.median(gp)) if len(gp) else None
    recovered = int(steps[ev.end]) if ev.end is not None else None
    onset_step = int(steps[onset])
    return Spike(
        kind=ev.kind,
        onset_step=onset_step,
        peak_step=int(steps[ev.peak]),
        peak_loss=peak_loss,
        baseline_loss=baseline,
        magnitude=magnitude,
        z_score=None if z is None else round(z, 2),
        recovered_step=recovered,
        recovery_steps=None if recovered is None else recovered - onset_step,
        detected_by=list(ev.rules),
        peak_grad_norm=peak_gn,
        baseline_grad_norm=base_gn,
        grad_norm_precursor_step=int(steps[ev.precursor]) if ev.precursor is not None else None,
        reference_loss=reference,
        detail=ev.detail,
        cause=_lr_cause(series, an, onset_step, o),
    )


def _lr_cause(
    series: LogSeries, an: detect.Analysis, onset_step: int, o: RecoveryOptions
) -> Optional[str]:
    steps = series.steps
    best = None
    for a, lr0, lr1, _ in an.lr_restarts:
        s = int(steps[min(a + 1, len(steps) - 1)])
        if s <= onset_step and onset_step - s <= max(LR_CAUSE_STEPS, 20 * o.wait_steps):
            best = (s, lr0, lr1)
    if best is None:
        return None
    s, lr0, lr1 = best
    return f"LR restarted from {lr0:.3g} to {lr1:.3g} at step {s}; the trouble followed at step {onset_step}"


def detect_spikes(
    steps, loss, grad_norm=None, options: Optional[RecoveryOptions] = None, **values
) -> list[Spike]:
    """Events in raw arrays (file order; restarts are merged, latest segment wins). Oldest first.

    steps: whole numbers >= 0; loss: floats (NaN/inf allowed: critical events); grad_norm: optional,
    NaN where not logged. options: RecoveryOptions or its fields as keywords. UsageError on bad input.
    """
    o = settings.build(options, **values)
    series = build_series(
        steps, loss, grad_norm, grad_norm_key="grad_norm" if grad_norm is not None else None
    )
    return spikes_of(series, o)


def advise(
    log_path,
    checkpoints: CheckpointsArg = None,
    *,
    milestones=None,
    log_format: str = "auto",
    step_key: Optional[str] = None,
    loss_key: Optional[str] = None,
    grad_norm_key: Optional[str] = None,
    lr_key: Optional[str] = None,
    run: Optional[str] = None,
    options: Optional[RecoveryOptions] = None,
    level: Optional[str] = "quick",
    **values,
) -> RecoveryReport:
    """Read a training log, find trouble and compute the recovery playbook.

    Stable API (used by the training-stability-monitor integration, prune and handoff):

    log_path       a trainer_state.json, CSV (W&B export, Lightning metrics.csv), JSON/JSON lines file,
                   TensorBoard events file or folder, or a run/checkpoint folder (newest trainer_state.json).
    checkpoints    None: found next to the log; a folder path; a string "500,1000"; or a sequence of
                   steps or (step, path) tuples.
    milestones     extra long-kept checkpoints (same forms); resume points too.
    step_key/loss_key/grad_norm_key/lr_key/run   column names (default: common names).
    options        a RecoveryOptions (or its fields as keywords: window, z_threshold, ratio_threshold,
                   max_ratio, min_rise, tolerance, wait_steps, min_wait_steps, margin, lr_multiplier,
                   lr_reduced_steps, grad_clip, skip_past_onset; see recovery.settings).
    level          the validator's level for the candidate checkpoints (quick, full, deep; None: not
                   validated, the caller did): invalid, incomplete and not-resumable ones are skipped,
                   each named in `warnings` ("checkpoint-200 skipped: invalid: ...").

    Returns a RecoveryReport. Raises checkpoint_strategy.errors.UsageError (one line) on bad input;
    never loads a checkpoint.
    """
    return advise_with_series(
        log_path,
        checkpoints,
        milestones=milestones,
        log_format=log_format,
        step_key=step_key,
        loss_key=loss_key,
        grad_norm_key=grad_norm_key,
        lr_key=lr_key,
        run=run,
        options=options,
        level=level,
        **values,
    )[0]


def advise_with_series(
    log_path,
    checkpoints: CheckpointsArg = None,
    *,
    milestones=None,
    log_format: str = "auto",
    step_key=None,
    loss_key=None,
    grad_norm_key=None,
    lr_key=None,
    run=None,
    options: Optional[RecoveryOptions] = None,
    level: Optional[str] = "quick",
    **values,
):
    """`advise`, also returning the LogSeries and the checkpoint list it used (for --plot)."""
    o = settings.build(options, **values)
    if isinstance(log_path, str) and not log_path.strip():
        raise UsageError("LOG: empty path: expected a training log file or a run folder")
    series = read_log(
        log_path,
        log_format=log_format,
        columns=Columns(step=step_key, loss=loss_key, grad_norm=grad_norm_key, lr=lr_key, run=run),
    )
    rollbacks = rollback_records(series.path)
    series = after_rollbacks(series, rollbacks)
    ck_source, ck_root, ck_list = _checkpoint_list(
        checkpoints, series.path if log_path is None else log_path
    )
    miles = _milestone_list(milestones)
    ck_list, skipped = ckptsteps.validated(ck_list, level)
    miles, skipped_miles = ckptsteps.validated(miles, level)
    report = advise_series(
        series,
        ck_list,
        checkpoints_source=ck_source,
        checkpoints_root=ck_root,
        milestones=miles,
        options=o,
    )
    if rollbacks:
        report.reasons.insert(0, _rollbacks_line(rollbacks))
    report.warnings.extend(series.notes + skipped + skipped_miles)
    return report, series, ck_list + [(s, p) for s, p in miles]


# the records callbacks/guard.py writes into its loss log
ROLLBACK_EVENT = b'"checkpoint-strategy:rollback"'


def rollback_records(path: str) -> list[dict]:
    """The automatic rollbacks a training callback recorded in its JSON-lines loss log (callbacks/guard.py), in
    file order; [] for any other log. Only the lines holding the event name are parsed, the log read a block of
    whole lines at a time by the JSON-lines reader's own `records.line_blocks` (a map of the whole log put all of
    it in recover's resident memory: peak RSS on a 34 MB log 1.9x -> 2.7x the file)."""
    if not isinstance(path, str) or not path.endswith(".jsonl") or not os.path.isfile(path):
        return []
    out: list[dict] = []
    try:
        with open(path, "rb") as fh:
            for block, _lineno, _n, _ended in records.line_blocks(fh, b""):
                out.extend(_records_in(block, len(block)))
    except OSError:
        return []
    return out


def _records_in(buf: bytes, whole: int) -> list[dict]:
    """The rollback records among the whole lines in buf[:whole]."""
    out: list[dict] = []
    i = buf.find(ROLLBACK_EVENT, 0, whole)
    while i >= 0:
        start, end = buf.rfind(b"\n", 0, i) + 1, buf.find(b"\n", i, whole)
        end = whole if end < 0 else end
        try:
            rec = json.loads(buf[start:end])
        except ValueError:
            rec = None
        if (
            isinstance(rec, dict)
            and isinstance(rec.get("resume_step"), int)
            and isinstance(rec.get("at_step"), int)
        ):
            out.append(rec)
        i = buf.find(ROLLBACK_EVENT, end, whole)
    return out


def after_rollbacks(series: LogSeries, rollbacks: list[dict]) -> LogSeries:
    """The timeline after the automatic rollbacks: the losses the rolled-back pass logged after the checkpoint
    resumed from (resume_step < step < the first step logged after the rollback, the skipped batches between)
    belong to an abandoned timeline, not to the run. Without this, merging the restart (the latest segment wins
    only for the steps it repeats) joins the old spike to the losses after the skipped batches."""
    if not rollbacks or not series.restarts:
        return series
    drop = np.zeros(len(series.steps), dtype=bool)
    for rb in rollbacks:
        after = [
            r
            for r in series.restarts
            if r["previous_step"] >= rb["at_step"] and r["step"] > rb["resume_step"]
        ]
        if after:
            drop |= (series.steps > rb["resume_step"]) & (series.steps < after[0]["step"])
    if not drop.any():
        return series
    keep = ~drop

    def sel(a):
        return None if a is None else a[keep]

    return dataclasses.replace(
        series,
        steps=series.steps[keep],
        loss=series.loss[keep],
        grad_norm=sel(series.grad_norm),
        lr=sel(series.lr),
    )


def _rollbacks_line(rollbacks: list[dict]) -> str:
    shown = "; ".join(
        f"at step {rb['at_step']} ({rb.get('reason', 'unrecovered spike')}, onset {rb.get('onset')}) to "
        f"{os.path.basename(str(rb.get('checkpoint', '?')))} (step {rb['resume_step']})"
        + (
            f", steps {rb['skip'][0]}-{rb['skip'][1]} skipped"
            if isinstance(rb.get("skip"), list) and len(rb["skip"]) == 2
            else ""
        )
        for rb in rollbacks[-5:]
    )
    return (
        f"the run rolled back by itself {len(rollbacks)} time(s) (checkpoint-strategy's playbook): {shown}; "
        "judged on the curve after the last rollback"
    )


def log_info(series: LogSeries) -> LogInfo:
    return LogInfo(
        path=series.path,
        format=series.format,
        step_key=series.step_key,
        loss_key=series.loss_key,
        grad_norm_key=series.grad_norm_key,
        lr_key=series.lr_key,
        entries=series.entries,
        points=len(series.steps),
        first_step=int(series.steps[0]),
        last_step=int(series.steps[-1]),
        log_interval=series.log_interval,
    )


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
    seg = series.steps[max(0, idx - detect.BASELINE_POINTS) : idx + 1]
    if len(seg) < 2:
        return series.log_interval
    return max(1, int(np.median(np.diff(seg))))


def overrides(
    resume_path: Optional[str],
    resume_step: int,
    skip: list[int],
    lr_multiplier: float,
    lr_steps: int,
    grad_clip: float,
    previous_clip: Optional[float] = None,
) -> Overrides:
    """Ready-to-paste HF Trainer and Lightning code for this resume (templates/recover-hf.py.j2,
    recover-lightning.py.j2). previous_clip: the run's own max_grad_norm when a file says so
    (training_args.json); never guessed."""
    values = dict(
        path=resume_path if resume_path is not None else f"<checkpoint of step {resume_step}>",
        resume_step=resume_step,
        lr_lo=resume_step + 1,
        lr_hi=resume_step + lr_steps,
        skip=skip,
        lr_multiplier=lr_multiplier,
        grad_clip=grad_clip,
        previous_clip=previous_clip,
    )
    return Overrides(
        hf_trainer=render_template("recover-hf.py.j2", **values),
        lightning=render_template("recover-lightning.py.j2", **values),
    )


def _common(
    series: LogSeries,
    o: RecoveryOptions,
    an: detect.Analysis,
    spikes: list[Spike],
    ck_info: CheckpointsInfo,
    reasons: list[str],
    warnings: list[str],
) -> dict:
    restarts = [Restart(**r) for r in series.restarts]
    if restarts:
        shown = ", ".join(f"{r.previous_step}->{r.step}" for r in restarts[:5])
        more = f" and {len(restarts) - 5} more" if len(restarts) > 5 else ""
        reasons.append(
            f"the log restarts {len(restarts)} time(s) ({shown}{more}); the latest segment wins "
            "for repeated steps"
        )
    thresholds = Thresholds(**{k: getattr(o, k) for k in Thresholds.model_fields})
    return dict(
        log=log_info(series),
        spikes=spikes,
        checkpoints=ck_info,
        restarts=restarts,
        thresholds=thresholds,
        warnings=warnings,
        reasons=reasons,
        verdict=an.verdict,
        best_model_checkpoint=getattr(series, "best_model_checkpoint", None),
    )


def _eval_opinion(series: LogSeries, o: RecoveryOptions) -> Optional[EvalOpinion]:
    es, ev = getattr(series, "eval_steps", None), getattr(series, "eval_loss", None)
    if es is None or ev is None:
        return None
    ok = np.isfinite(ev)
    es, ev = es[ok], ev[ok]
    if len(ev) < 3:
        return None
    b = int(np.argmin(ev))
    best_step, best, last_step, last = int(es[b]), float(ev[b]), int(es[-1]), float(ev[-1])
    rose = last > best + max(o.tolerance * abs(best), 1e-12) and last_step > best_step
    near = _train_median(series, best_step - max(o.wait_steps, 1) * 5, best_step, closed_low=False)
    after = _train_median(series, last_step - max(o.wait_steps, 1) * 5, last_step)
    joint = _joint_rise(series, es, ev, b, o) if rose else None
    train_held = (
        near is not None
        and after is not None
        and after <= near * (1 + o.tolerance)
        and joint is None
    )
    over = bool(rose and train_held)
    key = getattr(series, "eval_key", None) or "eval_loss"
    if over:
        note = (
            f"eval loss rose from {_show(best)} (step {best_step}) to {_show(last)} (step {last_step}) while the "
            f"train loss fell or held: overfitting, not a spike; no rollback for it, but release the checkpoint "
            f"nearest step {best_step} (lowest eval loss), or stop earlier / regularise"
        )
    elif rose:
        both = (
            ""
            if joint is None
            else (
                f" (both past the tolerance first at step {joint[0]}: eval {joint[2]:+.0%}, train {joint[3]:+.0%}; the "
                f"last eval step both were healthy is {joint[1]}; not overfitting)"
            )
        )
        note = (
            f"eval loss rose from {_show(best)} (step {best_step}) to {_show(last)} (step {last_step}) together "
            f"with the train loss{both}: it confirms the train-loss trouble"
        )
    else:
        note = f"eval loss {_show(last)} at step {last_step} is within {o.tolerance:.0%} of its best {_show(best)}"
    return EvalOpinion(
        key=key,
        points=len(ev),
        best_step=best_step,
        best_loss=best,
        last_step=last_step,
        last_loss=last,
        overfitting=over,
        rose_with_train_step=joint[0] if joint else None,
        healthy_step=joint[1] if joint else None,
        note=note,
    )


def _train_median(
    series: LogSeries, lo: float, hi: int, closed_low: bool = True
) -> Optional[float]:
    """Median of the finite train losses logged at steps lo..hi (lo excluded unless closed_low)."""
    steps, loss = series.steps, series.loss
    sel = loss[((steps >= lo) if closed_low else (steps > lo)) & (steps <= hi)]
    sel = sel[np.isfinite(sel)]
    return float(np.median(sel)) if len(sel) else None


def _joint_rise(series: LogSeries, es: np.ndarray, ev: np.ndarray, b: int, o: RecoveryOptions):
    """The first eval after the best (index b) where the eval loss rose past the tolerance and the train loss
    logged since the eval before it rose past the tolerance too (over its median since the eval before the best):
    (that eval step, the eval step before it, eval rise, train rise), or None. Overfitting is the eval loss rising
    while the train loss falls or holds; both rising is the start of the trouble."""
    best = float(ev[b])
    base = _train_since(series, int(es[b - 1]) if b > 0 else -(1 << 62), int(es[b]))
    if base is None or base <= 0:
        return None
    # the eval loss's own noise (from one eval to the next): a noisy eval's best is a low draw, and every later
    # eval is "above" it; a rise must clear the noise as well as the tolerance
    noise = 1.4826 * float(np.median(np.abs(np.diff(ev)))) / math.sqrt(2) if len(ev) > 2 else 0.0
    band = best + max(o.tolerance * abs(best), 3.0 * noise, 1e-12)
    above = ev > band
    for k in range(b + 1, len(ev)):
        if not above[k:].all():  # the rise holds to the last eval: the trouble, not a noisy eval
            continue
        now = _train_since(series, int(es[k - 1]), int(es[k]))
        if now is not None and now > base * (1 + o.tolerance):
            return int(es[k]), int(es[k - 1]), float(ev[k]) / best - 1, now / base - 1
    return None


def _train_since(series: LogSeries, lo: int, hi: int) -> Optional[float]:
    """Median of the train losses logged in (lo, hi], or of the last SMOOTH_POINTS logged at or before hi when
    there are fewer there (an eval every few steps leaves one or two train values between two evals)."""
    steps, loss = series.steps, series.loss
    sel = loss[(steps > lo) & (steps <= hi)]
    sel = sel[np.isfinite(sel)]
    if len(sel) < detect.SMOOTH_POINTS:
        sel = loss[steps <= hi][-detect.SMOOTH_POINTS :]
        sel = sel[np.isfinite(sel)]
    return float(np.median(sel)) if len(sel) else None


def _verdict_text(
    an: detect.Analysis, target: Optional[Spike], series: LogSeries, o: RecoveryOptions
) -> str:
    """Where the loss is at the end of the log, as evidence for the decision (the decision itself is the
    report's status and summary: this line never names a competing one)."""
    if target is None or an.target is None:
        return "no event has left the loss above its healthy level"
    r = target.reference_loss if target.reference_loss is not None else target.baseline_loss
    now = series.loss[-detect.SMOOTH_POINTS :]
    now_v = float(np.median(now)) if np.isfinite(now).all() else None
    if an.verdict == "recovering":
        if an.rate is not None and an.eta_step is not None:
            late = an.eta_step > target.onset_step + o.wait_steps
            return (
                f"coming down: {_show(now_v)} now vs the healthy level {_show(r)}; the excess shrinks "
                f"{(1 - math.exp(-an.rate * 100)):.0%} per 100 steps: back within {o.tolerance:.0%} "
                + (
                    f"only by about step {an.eta_step}, after the wait window (step {target.onset_step + o.wait_steps})"
                    if late
                    else f"by about step {an.eta_step}"
                )
            )
        return (
            f"too early to tell: {int(series.steps[-1]) - target.onset_step} steps since the onset"
        )
    if now_v is None:
        return "NaN/inf at the end of the log"
    if target.kind == "collapse":
        return f"collapsed ({target.detail})"
    ratio = f" ({now_v / r:.2f}x)" if r and r > 0 else ""
    return (
        f"{_show(now_v)} at step {int(series.steps[-1])}{ratio} vs the healthy level {_show(r)} before step "
        f"{target.onset_step}, and not coming back"
    )


def advise_series(
    series: LogSeries,
    checkpoints: list[tuple[int, Optional[str]]],
    *,
    checkpoints_source: str = "list",
    checkpoints_root: Optional[str] = None,
    milestones: Optional[list[tuple[int, Optional[str]]]] = None,
    options: Optional[RecoveryOptions] = None,
    **values,
) -> RecoveryReport:
    """`advise` on an already-read LogSeries and checkpoint list."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return _advise_series(
            series,
            checkpoints,
            checkpoints_source,
            checkpoints_root,
            milestones,
            settings.build(options, **values),
        )


def _advise_series(
    series: LogSeries,
    checkpoints,
    checkpoints_source: str,
    checkpoints_root: Optional[str],
    milestones,
    o: RecoveryOptions,
) -> RecoveryReport:
    milestones = milestones or []
    an = analysis_of(series, o)
    spikes = [_spike(series, e, an, o) for e in an.events]
    ck_info = _checkpoints_info(checkpoints, checkpoints_source, checkpoints_root)
    warnings: list[str] = []
    reasons: list[str] = []
    common = _common(series, o, an, spikes, ck_info, reasons, warnings)
    evo = _eval_opinion(series, o)
    common["eval"] = evo
    target = spikes[an.target] if an.target is not None else None
    common["verdict_detail"] = _verdict_text(an, target, series, o)
    if an.verdict == "recovering" and an.rate is not None:
        common.update(recovery_rate=round(an.rate, 8), back_by_step=an.eta_step)
    none = dict(
        resume_checkpoint=None,
        skip_batches=None,
        lr_multiplier=None,
        lr_reduced_steps=None,
        grad_clip=None,
    )
    loss_spikes = [s for s in spikes if s.kind != "grad_norm"]
    if evo is not None and (evo.overfitting or not loss_spikes):
        reasons.append(evo.note)
    if not spikes:
        return _no_spike(series, evo, none, common)
    if not loss_spikes:
        return _grad_only(spikes[-1], o, reasons, none, common)
    spike = target if target is not None else loss_spikes[-1]
    if spike.cause:
        reasons.append(spike.cause)
    if spike.recovered_step is not None:
        return _recovered(spike, o, reasons, warnings, none, common)
    return _unrecovered(
        series, spike, an, checkpoints, milestones, o, reasons, warnings, ck_info, common
    )


def _checkpoints_info(
    checkpoints, checkpoints_source: str, checkpoints_root: Optional[str]
) -> CheckpointsInfo:
    """What the report says of the checkpoints it chose among: where they came from, how many, which steps."""
    ck_steps = [s for s, _ in checkpoints]
    return CheckpointsInfo(
        source=checkpoints_source if checkpoints else "none",
        root=checkpoints_root,
        count=len(checkpoints),
        first_step=min(ck_steps) if ck_steps else None,
        last_step=max(ck_steps) if ck_steps else None,
    )


def _no_spike(
    series: LogSeries, evo: Optional[EvalOpinion], none: dict, common: dict
) -> RecoveryReport:
    """The report of a log without a spike: keep training (the eval loss's overfitting said, not rolled back)."""
    steps = series.steps
    extra = (
        "; eval loss says overfitting (no rollback for it)"
        if evo is not None and evo.overfitting
        else ""
    )
    return RecoveryReport(
        status="no_spike",
        summary=f"no loss spike in {len(steps)} logged steps "
        f"({int(steps[0])}-{int(steps[-1])}): keep training{extra}",
        spike=None,
        self_recovered=None,
        wait_until_step=None,
        **none,
        **common,
    )


def _grad_only(
    spike: Spike, o: RecoveryOptions, reasons: list[str], none: dict, common: dict
) -> RecoveryReport:
    done = spike.recovered_step is not None
    base_l, peak_l = spike.baseline_loss, spike.peak_loss
    rose = (
        base_l is not None
        and peak_l is not None
        and math.isfinite(peak_l)
        and base_l > 0
        and peak_l > base_l * (1 + o.tolerance)
    )
    # early in training the rolling median is still high, so the loss rules may not fire
    if rose and base_l is not None and peak_l is not None:
        reasons.append(
            f"grad norm spiked at step {spike.onset_step} (peak {spike.peak_grad_norm} vs median "
            f"{spike.baseline_grad_norm}); the loss rose to {_show(peak_l)} ({peak_l / base_l:.2f}x "
            f"its median {_show(base_l)}) without crossing the loss-spike thresholds"
        )
        loss_words = "loss rise below the spike thresholds"
    else:
        reasons.append(
            f"grad norm spiked at step {spike.onset_step} (peak {spike.peak_grad_norm} vs median "
            f"{spike.baseline_grad_norm}) but the loss stayed near its baseline"
        )
        loss_words = "loss unaffected"
    # a grad-norm spike that is over and left the loss alone is not headlined as an event: keep training
    quiet = done and not rose
    return RecoveryReport(
        status="no_spike" if quiet else "self_recovered" if done else "wait",
        summary=(
            f"no loss spike: keep training (a grad-norm spike at step {spike.onset_step}, "
            f"{loss_words})"
        )
        if quiet
        else f"grad-norm spike at step {spike.onset_step}, {loss_words}: keep training"
        + ("" if done else " and watch the grad norm and loss"),
        spike=spike,
        self_recovered=done,
        wait_until_step=spike.onset_step + o.wait_steps,
        **none,
        **common,
    )


def _recovered(
    spike: Spike,
    o: RecoveryOptions,
    reasons: list[str],
    warnings: list[str],
    none: dict,
    common: dict,
) -> RecoveryReport:
    onset = spike.onset_step
    _describe(spike, reasons)
    took = spike.recovery_steps or 0
    if took <= o.wait_steps:
        reasons.append(
            f"the loss was back within {o.tolerance:.0%} of the healthy level by step "
            f"{spike.recovered_step}, {took} steps after the onset (inside the {o.min_wait_steps}-"
            f"{o.wait_steps}-step wait window): the optimizer absorbed it"
        )
    else:
        warnings.append(
            f"the loss took {took} steps to come back (longer than the {o.wait_steps}-step wait "
            "window); no rollback needed now, but compare evals before and after the spike"
        )
        reasons.append(f"the loss is back near the healthy level since step {spike.recovered_step}")
    what = {"level_shift": "level shift", "collapse": "collapse"}.get(spike.kind, "loss spike")
    if _minor(spike, o):
        shown = f" ({spike.magnitude:.3g}x)" if spike.magnitude else ""
        reasons.append(
            f"no loss spike past the spike thresholds (>= {o.ratio_threshold:g}x the rolling median, "
            f">= {o.max_ratio:g}x the window max, NaN/inf): the {what} at step {onset}{shown} is a blip "
            "inside the run's own noise band, noted, not an event"
        )
        return RecoveryReport(
            status="no_spike",
            summary=f"no loss spike past the thresholds: keep training (a "
            f"{what} of {spike.magnitude or 0:.3g}x at step {onset} came back by step "
            f"{spike.recovered_step})",
            spike=spike,
            self_recovered=True,
            wait_until_step=None,
            **none,
            **common,
        )
    return RecoveryReport(
        status="self_recovered",
        summary=f"{what} at step {onset} recovered by step {spike.recovered_step}: keep training",
        spike=spike,
        self_recovered=True,
        wait_until_step=onset + o.wait_steps,
        **none,
        **common,
    )


def _minor(spike: Spike, o: RecoveryOptions) -> bool:
    """A recovered event that crossed none of the magnitude thresholds of a loss spike: no NaN/inf, no collapse,
    not >= ratio_threshold x the rolling median (or its pre-spike level), not >= max_ratio x the window max. The
    z rule alone fires on a quiet loss for a move of a few percent and a level shift that came back stayed
    within a small excess: the headline does not report those as events (the report still names them)."""
    if spike.kind not in ("spike", "level_shift") or spike.magnitude is None:
        return False
    loud = {
        k
        for k in ("ratio", "max")
        if any(r == settings.rule_labels(o)[k] for r in spike.detected_by)
    }
    return not loud and spike.magnitude < o.ratio_threshold


def _describe(spike: Spike, reasons: list[str]) -> None:
    what = KIND_WORDS[spike.kind]
    ref = spike.reference_loss if spike.reference_loss is not None else spike.baseline_loss
    detail = f" ({spike.detail})" if spike.detail else ""
    reasons.append(
        f"{what} at step {spike.onset_step}{detail}: peak {_show(spike.peak_loss)} at step "
        f"{spike.peak_step} vs healthy level {_show(ref)}"
        + (f" ({spike.magnitude:.3g}x the pre-spike level)" if spike.magnitude else "")
        + f"; detected by {'; '.join(spike.detected_by) or 'the rolling baseline'}"
    )
    if spike.grad_norm_precursor_step is not None:
        reasons.append(
            f"the grad norm spiked first, at step {spike.grad_norm_precursor_step}: onset moved there"
        )


@dataclass
class _Trouble:
    """An unrecovered event as the resume decision sees it: where it starts, the healthy level, the cutoff."""

    onset: int
    onset_idx: int
    ref: Optional[float]  # the healthy level
    # healthy level + tolerance: a resume point's smoothed loss must be at or below it
    level: Optional[float]
    wait_until: int
    margin: int
    last_step: int
    waiting: bool = False

    @property
    def cutoff(self) -> int:
        """The newest step a resume point may have: onset - margin."""
        return self.onset - self.margin


def _unrecovered(
    series: LogSeries,
    spike: Spike,
    an: detect.Analysis,
    checkpoints,
    milestones,
    o: RecoveryOptions,
    reasons: list[str],
    warnings: list[str],
    ck_info: CheckpointsInfo,
    common: dict,
) -> RecoveryReport:
    _describe(spike, reasons)
    t = _trouble(series, spike, o, reasons, common)
    t.waiting = _wait_or_roll_back(series, spike, t, o, reasons)
    reasons.append(f"the loss now: {common['verdict_detail']}")
    ck_info.cutoff_step, ck_info.margin_steps = t.cutoff, t.margin
    pre = series.steps[: t.onset_idx]
    common["last_good_step"] = int(pre[-1]) if len(pre) else None
    ck_info.post_event = [
        CheckpointRef(step=s, path=p, tag="post_event") for s, p in checkpoints if s > t.cutoff
    ]
    earlier = [s for s in common["spikes"] if s.onset_step < t.onset and s.kind != "grad_norm"]
    chosen = _resume_point(series, t, checkpoints, milestones, earlier, o, warnings)
    _best_model_note(series, t.cutoff, t.onset, reasons, warnings)
    nearest = _nearest_milestone(series, milestones, t)
    playbook = dict(
        lr_multiplier=o.lr_multiplier, lr_reduced_steps=o.lr_reduced_steps, grad_clip=o.grad_clip
    )
    if chosen is None:
        status, summary, policy = _no_resume_point(
            t,
            KIND_WORDS[spike.kind],
            checkpoints,
            milestones,
            nearest,
            o,
            reasons,
            warnings,
            common,
        )
        return RecoveryReport(
            status=status,
            summary=summary,
            spike=spike,
            self_recovered=False,
            wait_until_step=t.wait_until,
            resume_checkpoint=None,
            nearest_milestone=nearest,
            skip_batches=None,
            policy_advice=policy,
            **playbook,
            **common,
        )
    return _resume_report(spike, t, chosen, nearest, ck_info, o, reasons, playbook, common)


def _trouble(
    series: LogSeries, spike: Spike, o: RecoveryOptions, reasons: list[str], common: dict
) -> _Trouble:
    """Where the unrecovered `spike`'s trouble starts (moved back to the last eval step both losses were healthy
    at when they rose together, saying why), its healthy level and the margin before it."""
    steps = series.steps
    onset = spike.onset_step
    onset_idx = int(np.searchsorted(steps, onset))
    ref = spike.reference_loss if spike.reference_loss is not None else spike.baseline_loss
    interval = _interval_before(series, onset_idx)
    margin = o.margin if o.margin is not None else interval + 1
    sharp = spike.kind in ("nonfinite", "collapse") or (spike.magnitude or 0.0) >= o.ratio_threshold
    healthy = _eval_healthy_step(common.get("eval"), onset, margin, sharp)
    # the eval and train losses rose together before the train-loss onset
    if healthy is not None:
        onset_idx = int(np.searchsorted(steps, healthy, side="right"))
        onset, margin = int(steps[onset_idx]), int(steps[onset_idx]) - healthy
        reasons.append(
            f"the eval and train losses rose together at step {common['eval'].rose_with_train_step}, "
            f"before the {KIND_WORDS[spike.kind]}: the trouble began after step {healthy}, the last eval "
            f"step both were healthy at (eval at step N judges the weights of checkpoint N)"
        )
    return _Trouble(
        onset=onset,
        onset_idx=onset_idx,
        ref=ref,
        level=_resume_level(series, onset_idx, ref, o),
        wait_until=onset + o.wait_steps,
        margin=margin,
        last_step=int(steps[-1]),
    )


def _nearest_milestone(series: LogSeries, milestones, t: _Trouble) -> Optional[CheckpointRef]:
    """The milestone nearest the cutoff (the older of two as near), with its smoothed loss when it is at or
    before the cutoff; None without milestones."""
    if not milestones:
        return None
    m = min(milestones, key=lambda c: (abs(c[0] - t.cutoff), c[0]))
    return CheckpointRef(
        step=m[0],
        path=m[1],
        kind="milestone",
        smoothed_loss=_smoothed_loss(series, m[0], t.onset_idx) if m[0] <= t.cutoff else None,
    )


def _resume_report(
    spike: Spike,
    t: _Trouble,
    chosen: CheckpointRef,
    nearest: Optional[CheckpointRef],
    ck_info: CheckpointsInfo,
    o: RecoveryOptions,
    reasons: list[str],
    playbook: dict,
    common: dict,
) -> RecoveryReport:
    """The report of a resume from `chosen` (now, or if the loss is not back by the end of the wait): the
    batches to skip, the lowered learning rate, the overrides that do it."""
    onset = t.onset
    r = chosen.step
    skip = [r + 1, onset + o.skip_past_onset]
    _resume_reasons(t, chosen, skip, ck_info, o, reasons)
    where = chosen.path or f"step {r}"
    summary = (
        f"{KIND_WORDS[spike.kind]} at step {onset} not recovered: resume from {where}"
        if not t.waiting
        else f"loss spike at step {onset}: keep training until step {t.wait_until}; if not back below "
        f"{_show(t.level)}, resume from {where}"
    )
    return RecoveryReport(
        status="wait" if t.waiting else "rollback",
        summary=summary,
        spike=spike,
        self_recovered=False,
        wait_until_step=t.wait_until,
        resume_checkpoint=chosen,
        nearest_milestone=nearest,
        skip_batches=skip,
        lr_reduced_until_step=r + o.lr_reduced_steps,
        overrides=overrides(chosen.path, r, skip, o.lr_multiplier, o.lr_reduced_steps, o.grad_clip),
        **playbook,
        **common,
    )


def _resume_level(
    series: LogSeries, onset_idx: int, ref: Optional[float], o: RecoveryOptions
) -> Optional[float]:
    """The highest smoothed loss (median of SMOOTH_CHECKPOINT_POINTS) a resume point may have: the healthy level
    + the tolerance, or + 3 noise units of such a median when the loss before the onset is noisier than that
    (a noisy run's checkpoints one interval before the onset are not all outside a 10 % band by chance)."""
    if ref is None:
        return None
    pre = series.loss[max(0, onset_idx - 5 * detect.BASELINE_POINTS) : onset_idx]
    pre = pre[np.isfinite(pre)]
    noise = 0.0
    if len(pre) >= SMOOTH_CHECKPOINT_POINTS:
        scale = 1.4826 * float(np.median(np.abs(pre - np.median(pre))))
        noise = 3.0 * 1.2533 * scale / math.sqrt(SMOOTH_CHECKPOINT_POINTS)
    return ref + max(o.tolerance * abs(ref), noise)


def _eval_healthy_step(
    evo: Optional[EvalOpinion], onset: int, margin: int, sharp: bool
) -> Optional[int]:
    """The last eval step both losses were healthy at, when the eval and train losses rose together and the
    train-loss event cannot place the trouble better: the rise was seen at an eval before its onset, or the event
    is a mild one (below the spike magnitude thresholds, no NaN: a noisy train loss places a +15 % rise late);
    else None. A sharp event (a blow-up, a NaN) that the eval sees only at a later eval is placed better by the
    train loss than by evals far apart."""
    if evo is None or evo.healthy_step is None or evo.rose_with_train_step is None:
        return None
    if evo.healthy_step >= onset - margin:
        return None
    return evo.healthy_step if (evo.rose_with_train_step < onset or not sharp) else None


def _wait_or_roll_back(
    series: LogSeries, spike: Spike, t: _Trouble, o: RecoveryOptions, reasons: list[str]
) -> bool:
    """True while a plain spike is young enough to wait for (inside the wait window and not projected to stay
    above tolerance); says why either way."""
    elapsed = t.last_step - t.onset
    waiting = spike.kind == "spike" and elapsed < o.wait_steps
    projected = None
    if waiting and elapsed >= o.min_wait_steps and t.ref is not None:
        projected = _projected_excess(series, t.onset_idx, t.ref, t.wait_until)
        if projected is not None and projected > o.tolerance * abs(t.ref):
            waiting = False
    if spike.kind in ("nonfinite", "collapse"):
        reasons.append(
            "the loss is NaN/inf or pinned: it does not come back on its own, roll back now"
        )
    elif waiting:
        reasons.append(
            f"only {elapsed} steps since the onset: the spec says wait {o.min_wait_steps}-{o.wait_steps} "
            f"steps before rolling back; the plan below is ready if it is still above "
            f"{_show(t.level)} at step {t.wait_until}"
        )
    elif projected is not None:
        reasons.append(
            f"{elapsed} steps after the onset (past the {o.min_wait_steps}-step minimum wait) the loss is "
            f"still {_show(float(np.median(series.loss[-detect.SMOOTH_POINTS :])))}; at its current rate "
            f"of decay it would still be {_show(projected)} above the healthy level at step "
            f"{t.wait_until}, more than the {o.tolerance:.0%} tolerance: roll back now"
        )
    else:
        reasons.append(
            f"not back within {o.tolerance:.0%} of the healthy level {_show(t.ref)} {elapsed} steps after "
            f"the onset (last step {t.last_step}; wait window {o.wait_steps})"
        )
    return waiting


def _resume_point(
    series: LogSeries,
    t: _Trouble,
    checkpoints,
    milestones,
    earlier: list[Spike],
    o: RecoveryOptions,
    warnings: list[str],
) -> Optional[CheckpointRef]:
    """The newest checkpoint or milestone at or before the cutoff, outside earlier events, whose smoothed loss is
    within tolerance; else the newest such candidate (with a warning); None when there is none."""
    mg = t.margin

    def inside_earlier(s: int) -> bool:
        return any(
            e.onset_step - mg < s < (e.recovered_step if e.recovered_step is not None else math.inf)
            for e in earlier
        )

    fallback = None
    cands = [(s, p, "checkpoint") for s, p in checkpoints] + [
        (s, p, "milestone") for s, p in milestones
    ]
    ordered = sorted(
        {c for c in cands if c[0] <= t.cutoff}, key=lambda c: (-c[0], c[2], fm.resume_order(c[1]))
    )
    for s, p, kind in ordered:
        if inside_earlier(s):
            continue
        sm = _smoothed_loss(series, s, t.onset_idx)
        ok = None if (sm is None or t.level is None) else bool(sm <= t.level)
        ref_ck = CheckpointRef(
            step=s, path=p, kind=kind, smoothed_loss=sm, within_tolerance=ok, tag="resume"
        )
        if ok:
            return ref_ck
        if fallback is None:
            fallback = ref_ck
    if fallback is not None:
        warnings.append(
            f"no checkpoint at or before step {t.cutoff} has a smoothed loss within {o.tolerance:.0%} of "
            f"the healthy level {_show(t.ref)}; step {fallback.step} is the newest clean candidate "
            f"(smoothed loss {_show(fallback.smoothed_loss)})"
        )
    return fallback


def _no_resume_point(
    t: _Trouble,
    what: str,
    checkpoints,
    milestones,
    nearest: Optional[CheckpointRef],
    o: RecoveryOptions,
    reasons: list[str],
    warnings: list[str],
    common: dict,
) -> tuple[str, str, Optional[str]]:
    """Nothing to resume from: (status, summary, policy advice), with the reasons and warnings why."""
    if common["last_good_step"] is None or t.cutoff < 0:
        return _nothing_healthy(t, what, checkpoints, reasons)
    if not checkpoints and not milestones:
        return _none_given(t, what, reasons, warnings, common)
    cutoff, onset = t.cutoff, t.onset
    status = "wait" if t.waiting else "no_clean_checkpoint"
    policy = _policy_advice(
        sorted(ck_info_steps(checkpoints)), cutoff, t.last_step, onset, o.wait_steps
    )
    oldest = min(s for s, _ in checkpoints) if checkpoints else None
    reasons.append(
        f"no checkpoint predates the trouble: the resume point must be at or before step {cutoff} "
        f"(onset {onset} - margin {t.margin})"
        + (f", but the oldest kept is step {oldest}" if oldest is not None else "")
    )
    if nearest is not None:
        reasons.append(
            f"nearest milestone: step {nearest.step}"
            + (f" ({nearest.path})" if nearest.path else "")
        )
    summary = f"{what} at step {onset} not recovered and no checkpoint predates it: " + (
        "restart from the nearest milestone or from scratch"
        if nearest is None or nearest.step > cutoff
        else f"use milestone {nearest.step}"
    )
    return status, summary, policy


def _nothing_healthy(
    t: _Trouble, what: str, checkpoints, reasons: list[str]
) -> tuple[str, str, Optional[str]]:
    """No logged step before the onset is healthy: restart from scratch (no checkpoint of the run is safe)."""
    status = "wait" if t.waiting else "rollback"
    reasons.append(
        f"no logged step before the onset at step {t.onset} is healthy: the run was in trouble from "
        "its first logged values, so no checkpoint of it is a safe resume point"
    )
    if checkpoints and not t.waiting:
        status = "no_clean_checkpoint"
    return (
        status,
        (
            f"{what} at step {t.onset} not recovered and nothing before it is healthy: restart from "
            "scratch (or the initial weights) after checking the data, the learning rate and the loss "
            "scaling"
        ),
        None,
    )


def _none_given(
    t: _Trouble, what: str, reasons: list[str], warnings: list[str], common: dict
) -> tuple[str, str, Optional[str]]:
    """No checkpoints given or found: resume from the newest at or before the cutoff (the policy's milestone
    there named, in case the run kept them)."""
    warnings.append(
        "no checkpoints given or found next to the log: pass --checkpoints ROOT or a list "
        "such as 500,1000"
    )
    policy_m = _policy_milestone(t.cutoff)
    if policy_m is not None:
        reasons.append(
            f"last good step {common['last_good_step']}; if the run kept the policy's milestones "
            f"(1000 x 2^k), the nearest at or before step {t.cutoff} is step {policy_m}"
        )
    return (
        "wait" if t.waiting else "rollback",
        (
            f"{what} at step {t.onset} not recovered: resume from the newest checkpoint at or before "
            f"step {t.cutoff} (none given; last good step {common['last_good_step']})"
        ),
        None,
    )


def _resume_reasons(
    t: _Trouble,
    chosen: CheckpointRef,
    skip: list[int],
    ck_info: CheckpointsInfo,
    o: RecoveryOptions,
    reasons: list[str],
) -> None:
    r = chosen.step
    reasons.append(
        f"resume from step {r}: the newest checkpoint at or before step {t.cutoff} (onset {t.onset} - "
        f"margin {t.margin}; checkpoint N holds the weights whose loss is logged at N+1)"
        + (
            f" with smoothed loss {_show(chosen.smoothed_loss)} <= {_show(t.level)} (healthy level "
            f"{_show(t.ref)} + {_band_words(t, o)})"
            if chosen.within_tolerance
            else ""
        )
    )
    if ck_info.post_event:
        reasons.append(
            f"checkpoints {_steps_text([c.step for c in ck_info.post_event])} were saved after the onset: "
            "post-event, do not resume from them"
        )
    reasons.append(
        f"then: LR x{o.lr_multiplier:g} for steps {r + 1}-{r + o.lr_reduced_steps}, skip or reshuffle the "
        f"batches of steps {skip[0]}-{skip[1]} ({skip[1] - skip[0] + 1} batches; PaLM skipped ~200-500), "
        f"gradient clipping {o.grad_clip:g}"
    )


def _band_words(t: _Trouble, o: RecoveryOptions) -> str:
    if (
        t.ref is None
        or t.level is None
        or t.level - t.ref <= o.tolerance * abs(t.ref) * (1 + 1e-12)
    ):
        return f"{o.tolerance:.0%}"
    return (
        "3 noise units of a median of 11: the loss before the onset is noisier than the tolerance"
    )


def ck_info_steps(checkpoints) -> list[int]:
    return [s for s, _ in checkpoints]


def _policy_milestone(cutoff: int) -> Optional[int]:
    if cutoff < 1000:
        return None

    found = [m for m in milestone_steps("pow2", cutoff) if m <= cutoff and m % 1000 == 0]
    return max(found) if found else None


def _best_model_note(
    series: LogSeries, cutoff: int, onset: int, reasons: list[str], warnings: list[str]
) -> None:
    best = getattr(series, "best_model_checkpoint", None)
    if not best:
        return
    step = parse_step(os.path.basename(str(best).rstrip("/\\")))
    if step is None:
        return
    if step <= cutoff:
        reasons.append(
            f"the log names best_model_checkpoint {best} (step {step}), which predates the trouble: "
            "a clean resume point too"
        )
    else:
        warnings.append(
            f"the log's best_model_checkpoint {best} (step {step}) was saved after the onset at step "
            f"{onset}: do not resume from it"
        )


def _projected_excess(
    series: LogSeries, onset_idx: int, base: float, until_step: int
) -> Optional[float]:
    """Excess loss over the healthy level projected to `until_step`, assuming it keeps decaying at the
    exponential rate seen since the onset (at most the last 50 logged values); None if unknown."""
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


def _policy_advice(
    ck_steps: list[int], cutoff: int, last_step: int, onset: int, wait_steps: int
) -> str:
    span = max(1, last_step - cutoff)
    if len(ck_steps) >= 2:
        freq = max(1, int(np.median(np.diff(sorted(ck_steps)))))
        need = math.ceil(span / freq) + 1
        return (
            f"the rolling window rotated past the spike: {len(ck_steps)} checkpoints every {freq} steps cover "
            f"{max(ck_steps) - min(ck_steps)} steps, but rolling back needs {span} (detection at step {last_step} "
            f"minus resume point {cutoff}). Keep at least {need} (keep_last >= {need}) so the window spans the "
            f"{wait_steps}-step wait window plus the time to notice, and keep milestones so an older clean "
            "point always survives"
        )
    return (
        f"only {len(ck_steps)} checkpoint(s) kept: keep a rolling window spanning at least {span} steps "
        f"(the {wait_steps}-step wait window plus the time to notice) and milestones"
    )


def _steps_text(steps: list[int], limit: int = 6) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f" and {len(steps) - limit} more" if len(steps) > limit else "")


def _show(v: Optional[float]) -> str:
    if v is None:
        return "NaN/inf"

    return fmt_num(v, 4 if abs(v) < 10 else 2)


# recover's advice completed for the run it read (`complete`, applied by the `recover` command after
# `advise_with_series`): what the run's own files say (max_steps, the old max_grad_norm,
# `formats.runlog.run_facts`: JSON files only, never training_args.bin, a pickle), the detected framework,
# and the ready actions (pin the rollback checkpoint, move the post-onset ones aside). Nothing is run.

_THEN = "then: LR x"


def framework_of(report: RecoveryReport) -> Optional[str]:
    """hf_trainer when the log is a trainer_state.json or the checkpoints are checkpoint-N folders;
    lightning when they are .ckpt files or the log is Lightning's metrics.csv; else None."""
    paths = [
        c.path
        for c in [report.resume_checkpoint, *report.checkpoints.post_event]
        if c is not None and c.path
    ]
    if report.log.format == "hf" or any(
        os.path.basename(os.path.normpath(p)).startswith("checkpoint-") for p in paths
    ):
        return "hf_trainer"
    if (
        any(p.endswith(".ckpt") for p in paths)
        or os.path.basename(report.log.path) == "metrics.csv"
    ):
        return "lightning"
    return None


def _clip_windows(report: RecoveryReport, max_steps: int) -> None:
    resume = report.resume_checkpoint
    if resume is None or report.lr_reduced_steps is None or report.skip_batches is None:
        return
    r = resume.step
    until = min(r + report.lr_reduced_steps, max_steps)
    report.lr_reduced_steps = max(0, until - r)
    report.lr_reduced_until_step = max(r, until)
    report.skip_batches = [
        report.skip_batches[0],
        max(report.skip_batches[0], min(report.skip_batches[1], max_steps)),
    ]


def _then_line(report: RecoveryReport) -> str:
    assert report.resume_checkpoint is not None and report.skip_batches is not None
    r, (s0, s1) = report.resume_checkpoint.step, report.skip_batches
    was = f" (was {report.previous_grad_clip:g})" if report.previous_grad_clip is not None else ""
    m = report.max_steps
    to = (
        f" (clipped to the run's max_steps {m})"
        if m is not None and report.lr_reduced_until_step == m
        else ""
    )
    return (
        f"then: LR x{report.lr_multiplier:g} for steps {r + 1}-{report.lr_reduced_until_step}{to}, skip or "
        f"reshuffle the batches of steps {s0}-{s1} ({s1 - s0 + 1} batches; PaLM skipped ~200-500), gradient "
        f"clipping {report.grad_clip:g}{was}"
    )


def _actions(report: RecoveryReport) -> list[str]:
    resume = report.resume_checkpoint
    out: list[str] = []
    if resume is None:
        return out
    if resume.path:
        out.extend(_rollback_actions(report, resume.path))
    if report.status == "rollback":
        out.append(verify_resume_action(report.log.path, report.log.format, resume.step))
    return out


def verify_resume_action(log: str, log_format: str, step: int) -> str:
    """The step after a rollback: check the resume kept the optimizer state, on the *resumed* run's log."""
    if log_format == "hf":
        where = (
            "the trainer_state.json of the first checkpoint the resumed run saves (not this run's: it stops "
            "before the resume)"
        )
    elif log_format == "tensorboard":
        where = "the resumed run's TensorBoard folder (the folder of the events file it writes)"
    else:
        where = (
            f"the resumed run's log; {os.path.basename(log)} again if the resumed run appends to it"
        )
    return (
        f"after resuming and logging a few steps: {runfacts.launcher()} verify-resume RESUMED_LOG "
        f"--resume-step {step}   (RESUMED_LOG: {where})"
    )


def _rollback_actions(report: RecoveryReport, path: str) -> list[str]:
    """Pin the resume point, move the post-onset checkpoints aside (or resume into a new folder)."""
    out: list[str] = []
    name = os.path.basename(os.path.normpath(path))
    out.append(
        f"pin {name} now: {runfacts.pin_command(path)}   (if the job is still running, copy it now: "
        "its rotation may delete it; HF: or raise save_total_limit)"
    )
    post = [c.path for c in report.checkpoints.post_event if c.path]
    onset = report.spike.onset_step if report.spike is not None else None
    move = runfacts.move_aside_command(post, report.checkpoints.root, onset)
    if move:
        out.append(
            f"move the {len(post)} post-onset checkpoints aside (a trainer resuming from the newest would "
            f"pick one): {move}"
        )
        where = {
            "hf_trainer": "a new output_dir",
            "lightning": "a new ModelCheckpoint dirpath",
        }.get(report.framework or "", "HF: a new output_dir; Lightning: a new dirpath")
        out.append(
            f"or resume into a new output folder ({where}) so the post-onset checkpoints are never picked"
        )
    return out


def _sharded_note(path: str) -> list[str]:
    """A resume checkpoint saved as DCP or ZeRO shards: the exact convert command for another GPU count."""
    from checkpoint_strategy.formats.worldsize import convert_command, saved_world_size

    saved = saved_world_size(path, "")
    command = convert_command(saved.path, saved.layout) if saved is not None else None
    if saved is None or command is None:
        return []
    return [
        f"{os.path.basename(os.path.normpath(path))} is {saved.layout} shards written by "
        f"{saved.world_size or 'an unknown number of'} process(es): to resume on another GPU count, {command}"
    ]


def complete(report: RecoveryReport) -> RecoveryReport:
    """Fill framework, max_steps, previous_grad_clip, run_facts and actions; clip the LR and skip
    windows to max_steps and rebuild the snippets with what is known (nothing invented)."""
    facts = run_facts(report.log.path)
    report.framework = framework_of(report)  # type: ignore[assignment]
    report.max_steps = facts.int("max_steps")
    report.previous_grad_clip = facts.get("max_grad_norm")
    report.run_facts = {k: facts.source[k] for k in sorted(facts.source)}
    resume = report.resume_checkpoint
    if resume is not None and resume.path:
        report.warnings += _sharded_note(resume.path)
    if (
        resume is None
        or report.skip_batches is None
        or report.lr_multiplier is None
        or report.grad_clip is None
    ):
        return report
    if report.max_steps is not None:
        _clip_windows(report, report.max_steps)
    assert report.lr_reduced_steps is not None
    report.overrides = overrides(
        resume.path,
        resume.step,
        report.skip_batches,
        report.lr_multiplier,
        report.lr_reduced_steps,
        report.grad_clip,
        report.previous_grad_clip,
    )
    report.reasons = [_then_line(report) if x.startswith(_THEN) else x for x in report.reasons]
    # after framework: the wording names the framework's own setting
    report.actions = _actions(report)
    return report
