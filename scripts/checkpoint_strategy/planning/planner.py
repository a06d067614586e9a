"""The planner: training-run numbers in, checkpointing policy out. Pure functions."""

from __future__ import annotations

import functools
import math
from typing import Any

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning import failure, inputs, sizing, tiers
from checkpoint_strategy.planning.models import (
    Assumption,
    CheckpointPolicy,
    FailureModel,
    IntervalChoice,
    IntervalReason,
    PlanArguments,
    PlanReport,
    Precision,
    SaveFormat,
    StorageBreakdown,
    StorageWrites,
)
from checkpoint_strategy.planning.rounding import nice_ceil, nice_floor, nice_steps
from checkpoint_strategy.planning.stages import Interval, SaveCost, Sizing
from checkpoint_strategy.vocabulary import MAX_STEPS, Milestones

# Llama 3 paper (Dubey et al. 2024, sec. 3.3.4): 419 unexpected interruptions in 54 days of
# pre-training on up to 16,384 H100 GPUs: 16384 * 54 * 24 / 419 = 50,676 GPU-hours each.
DEFAULT_GPU_MTBF_HOURS = 50000.0
# Spike horizon in steps: the spec waits 50-100 steps to see if a spike self-recovers, and
# PaLM (Chowdhery et al. 2022, sec. 5.1) restarted from about 100 steps before the spike.
SPIKE_WAIT_STEPS = 100
SPIKE_MARGIN_STEPS = 100
SPIKE_HORIZON_STEPS = SPIKE_WAIT_STEPS + SPIKE_MARGIN_STEPS
# With async saves training only waits for the snapshot to host memory; the PyTorch DCP
# async-save write-up (PyTorch blog, 2024) reports >10x less blocking time than a sync save.
ASYNC_BLOCKING_FRACTION = 0.1
# Assumed save stall when the model size is unknown and --checkpoint-write-seconds is not given.
UNKNOWN_SIZE_WRITE_SECONDS = 60.0
MAX_KEEP_LAST_AUTO = 50
# Volume checks on the final policy: warn when the storage writes checkpoints more than half the time
# (it also serves data loading and other jobs) or when a day's saves rewrite the whole storage budget more
# than 10 times (every 2.4 h: wear on flash, and a delete rate the file system must keep up with).
WRITE_BUSY_WARN = 0.5
DAILY_BUDGET_WARN = 10.0

PRESETS: dict[str, dict[str, Any]] = {
    # the spec's two templates; "auto" takes the failure-model optimum with the conservative
    # retention and both emergency triggers.
    # milestones when --milestones is not given: conservative 1000 x 2^k, aggressive 10k, 50k, 100k (the spec's
    # templates); auto the seed steps, made denser when the budget has room (use_budget)
    "conservative": {"max_frequency": 500, "keep_last": 10, "emergency": [], "milestones": "pow2"},
    "aggressive": {
        "max_frequency": 2000,
        "keep_last": 5,
        "milestones": [10000, 50000, 100000],
        "emergency": ["loss_spike_detected", "gradient_norm_exceeded"],
    },
    "auto": {
        "max_frequency": None,
        "keep_last": 10,
        "milestones": "seed",
        "emergency": ["loss_spike_detected", "gradient_norm_exceeded"],
    },
}

SOURCES = {
    "checkpoint_size": "spec: params x 4 bytes x 3 (fp32 weights + Adam m, v); mixed precision 14 B/param "
    "from ZeRO (Rajbhandari et al. 2020) 16 B/param minus fp16 gradients",
    "gpu_mtbf": "Llama 3 paper (Dubey et al. 2024): 419 unexpected interruptions in 54 days on 16,384 GPUs "
    "= ~50,000 GPU-hours per interruption",
    "interval": "exact minimiser of Daly 2006's expected wall time T(tau) (Lambert W); Young 1974 "
    "sqrt(2CM) and Daly 2006 eq. 37 shown beside it",
    "spike_horizon": "spec: wait 50-100 steps before acting; PaLM (Chowdhery et al. 2022) restarted ~100 "
    "steps before a spike; OLMo 2 (2025) on spike handling",
    "async": "PyTorch DCP async save (PyTorch blog 2024): training blocks only for the host snapshot, "
    "modelled as 10% of a synchronous save",
}


def milestone_steps(spec, total_steps: int) -> list[int]:
    """seed: 1000, 5000, then 1, 2.5, 5 x 10^k from 10 000 on; pow2: 1000 x 2^k; both keep the
    final step. A list is taken as given (steps past the end are dropped)."""
    if spec == "none":
        return []
    if isinstance(spec, list):
        return sorted({s for s in spec if 0 < s <= total_steps})
    out: list[int] = []
    if spec == "pow2":
        v = 1000
        while v <= total_steps:
            out.append(v)
            v *= 2
    else:  # seed
        out = [s for s in (1000, 5000) if s <= total_steps]
        k = 4
        while 10**k <= total_steps:
            out.extend(s for s in (10**k, 25 * 10 ** (k - 1), 5 * 10**k) if s <= total_steps)
            k += 1
    out.append(total_steps)
    return sorted(set(out))


def milestone_schedule(spec: Milestones, last_step: int) -> list[int]:
    """Steps a --milestones value names up to last_step (keywords expand like the planner's schedule,
    without the planner's extra 'final step' entry)."""
    if isinstance(spec, list):
        return [s for s in spec if s <= last_step]
    if spec == "none" or last_step < 1:
        return []
    return [s for s in milestone_steps(spec, MAX_STEPS) if s < MAX_STEPS and s <= last_step]


def saved_steps_tail(total_steps: int, frequency: int, n: int) -> list[int]:
    """The last n steps that get a checkpoint (multiples of frequency, plus the final step)."""
    tail = []
    if total_steps % frequency:
        tail.append(total_steps)
    s = (total_steps // frequency) * frequency
    while s > 0 and len(tail) < n:
        tail.append(s)
        s -= frequency
    return sorted(tail[:n])


def _storage(size, weights, keep_last, milestones, total_steps, frequency, formats):
    window = set(saved_steps_tail(total_steps, frequency, keep_last))
    outside = [m for m in milestones if m not in window]
    resume_copies = sum(1 for f in formats if f in ("full_state_dict", "sharded")) or 1
    exports = len(set(milestones) | {total_steps}) if "safetensors" in formats else 0
    if size is None:
        return StorageBreakdown.model_construct(
            checkpoint_size_gb=None,
            rolling_gb=None,
            in_flight_gb=None,
            milestones_gb=None,
            milestones_outside_window=len(outside),
            safetensors_exports_gb=None,
            safetensors_exports=exports,
            total_gb=None,
        )
    per = size * resume_copies
    rolling = keep_last * per
    in_flight = per
    ms = len(outside) * per
    ex = exports * weights
    return StorageBreakdown.model_construct(
        checkpoint_size_gb=_r(per),
        rolling_gb=_r(rolling),
        in_flight_gb=_r(in_flight),
        milestones_gb=_r(ms),
        milestones_outside_window=len(outside),
        safetensors_exports_gb=_r(ex),
        safetensors_exports=exports,
        total_gb=_r(rolling + in_flight + ms + ex),
    )


def _total_gb(size, weights, keep_last, milestones, total_steps, frequency, formats) -> float:
    """_storage's total_gb without building the model (use_budget tries several policies)."""
    window = set(saved_steps_tail(total_steps, frequency, keep_last))
    outside = len(milestones) - len(window.intersection(milestones))
    per = size * (sum(1 for f in formats if f in ("full_state_dict", "sharded")) or 1)
    exports = len(set(milestones) | {total_steps}) if "safetensors" in formats else 0
    return (keep_last + 1 + outside) * per + exports * weights


def _r(x: float, nd: int = 6) -> float:
    return float(round(x, nd))


def size_step(args: PlanArguments, warnings: list[str]) -> Sizing:
    """Size one checkpoint from --params or --model_size_gb (sizing.py) and check the formats."""
    params = sizing.resolve_params(args.params, args.model_size_gb, args.weights_dtype)
    precision: Precision | None = args.precision
    size = weights = None
    if params is not None:
        precision = resolved = sizing.resolve_precision(args.precision, args.weights_dtype)
        size = sizing.checkpoint_gb(params, resolved, args.save_optimizer)
        weights = sizing.weights_gb(params, resolved)
    else:
        warnings.append(
            "model size missing: storage is unknown; give --model_size_gb N or --params 7B"
        )
    if not args.save_optimizer:
        warnings.append(
            "optimizer state not saved: resuming restarts Adam's moments from zero "
            "(the spec's lesson 2); use it only for inference exports"
        )
    formats: list[SaveFormat] = inputs.default_formats(args)
    if not any(f in ("full_state_dict", "sharded") for f in formats):
        warnings.append(
            "no resumable format in --formats: add full_state_dict (or sharded) to resume training"
        )
    elif "full_state_dict" not in formats and args.formats:
        warnings.append(
            "only sharded (FSDP/DCP) checkpoints: DCP re-shards on load to another GPU count, but only "
            "PyTorch's distributed loader reads them; add full_state_dict (or safetensors) milestones "
            "for other tools and for a release"
        )
    return Sizing(params, precision, size, weights, formats)


def write_rate(args: PlanArguments) -> tuple[float, str, int]:
    """The job's write rate in GB/s, where it comes from, and the number of nodes.

    Each node writes its shard in parallel, so the rate is --node-write-gbps x nodes, capped by
    what the storage sustains (--storage-gbps); --write-gbps gives the job's rate directly.
    """
    nodes = math.ceil(args.gpus / args.gpus_per_node)
    if args.write_gbps is not None:
        return args.write_gbps, "--write-gbps", nodes
    per_node = nodes * args.node_write_gbps
    node_text = (
        f"{args.node_write_gbps:g} GB/s per node x {nodes} node{'s' if nodes > 1 else ''} "
        f"of {args.gpus_per_node} GPUs"
    )
    if per_node > args.storage_gbps:
        return (
            args.storage_gbps,
            f"{node_text}, capped by the storage's {args.storage_gbps:g} GB/s",
            nodes,
        )
    return per_node, node_text, nodes


def save_cost(args: PlanArguments, size: Sizing, warnings: list[str]) -> SaveCost:
    """Daly's C (the stall per save), the time until a save is on storage, the job MTBF and the optima."""
    async_save = True if args.async_save is None else args.async_save
    if args.mtbf_hours is not None:
        mtbf_h, mtbf_source = args.mtbf_hours, "--mtbf-hours"
    else:
        mtbf_h = args.gpu_mtbf_hours / args.gpus
        mtbf_source = f"{args.gpu_mtbf_hours:g} GPU-hours per GPU (Llama 3) / {args.gpus} GPUs"
    rate, source, nodes = write_rate(args)
    gbps: float | None = rate
    persist: float | None = None
    if args.checkpoint_write_seconds is not None:
        C = persist = args.checkpoint_write_seconds
        gbps, source = None, "--checkpoint-write-seconds"
    elif size.size_gb is not None:
        persist = size.size_gb / rate
        C = persist * (ASYNC_BLOCKING_FRACTION if async_save else 1.0)
    else:
        C = UNKNOWN_SIZE_WRITE_SECONDS
        warnings.append(
            f"checkpoint cost unknown: assumed {UNKNOWN_SIZE_WRITE_SECONDS:g} s per save; "
            "give --checkpoint-write-seconds or the model size"
        )
    M = mtbf_h * 3600.0
    return SaveCost(
        gbps,
        source,
        nodes,
        C,
        persist,
        async_save,
        mtbf_h,
        mtbf_source,
        M,
        args.restart_seconds,
        failure.exact_interval(C, M),
        failure.young_interval(C, M),
        failure.daly_interval(C, M),
    )


def overhead(tau: float, cost: SaveCost) -> float:
    """Daly's expected overhead at interval tau; bad input when the run would never finish."""
    try:
        value = failure.overhead_fraction(tau, cost.C, cost.R, cost.M)
        if not math.isfinite(value) or not math.isfinite(
            failure.expected_failures(1.0 + value, cost.M)
        ):
            raise OverflowError
    except OverflowError:
        raise UsageError(
            f"the failure model says this run never finishes: a job MTBF of {cost.mtbf_h:g} h against a restart "
            f"of {cost.R:g} s and saves costing {cost.C:g} s every {tau:g} s; expected --mtbf-hours well above "
            "the restart and save times (or fewer --gpus)"
        ) from None
    return value


def choose_interval(
    args: PlanArguments, cost: SaveCost, size: Sizing, warnings: list[str]
) -> Interval:
    """The save interval in steps: --frequency, or the failure-model optimum limited by the max-loss cap and
    the preset, never below --min-interval-seconds (unless the cap needs it), and never so short that a
    save starts before the previous one is on storage."""
    step, N = args.step_seconds, args.total_steps
    opt_steps = cost.tau_exact / step
    optimum = nice_steps(opt_steps) if math.isfinite(opt_steps) else N
    durable_steps = nice_ceil(cost.durable_gap / step) if cost.durable_gap > 0 else 1
    min_steps = nice_ceil(args.min_interval_seconds / step) if args.min_interval_seconds > 0 else 1
    cap_seconds = args.max_loss_hours * 3600.0 - cost.lag
    cap_steps = nice_floor(cap_seconds / step) if cap_seconds >= step else None
    preset = PRESETS[args.preset]
    reason: IntervalReason
    if args.frequency is not None:
        f, reason = args.frequency, "frequency_option"
        if f * step < args.min_interval_seconds and f >= durable_steps:
            warnings.append(
                f"--frequency {f} saves every {_h(f * step)}, more often than --min-interval-seconds "
                f"{args.min_interval_seconds:g}: each save costs {cost.C:.3g} s of training"
            )
    else:
        f, reason = optimum, "failure_model_optimum"
        # a cap or preset that sets the interval is how the plan was reached, not a problem with it: the report's
        # "Interval Set By" names it with its price; the warnings are the checks on the final policy
        if cap_steps is not None and f > cap_steps and cap_steps >= durable_steps:
            f, reason = cap_steps, "max_loss_cap"
        elif f > durable_steps and (cap_steps is None or f > cap_steps):
            # the cap cannot be kept: get as close to it as the storage (or the step length) allows
            f, reason = durable_steps, "storage_floor" if durable_steps > 1 else "max_loss_cap"
        if preset["max_frequency"] is not None and f > preset["max_frequency"]:
            f, reason = preset["max_frequency"], "preset"
        floor = min(min_steps, cap_steps) if cap_steps is not None else min_steps
        if f < floor:
            f, reason = floor, "min_interval"
    if f < durable_steps:
        warnings.append(_overlap_warning(f, durable_steps, cost, size, step))
        f, reason = durable_steps, "storage_floor"
    if f > N:
        warnings.append(
            f"total_steps {N} is below the interval {f}: "
            f"only the final checkpoint would be written; saving every {N} steps"
        )
        f, reason = N, "total_steps"
    floor_steps = max(durable_steps, min_steps)
    floor_source = (
        f"a save is on storage {cost.lag:.4g} s after it starts"
        if durable_steps >= min_steps
        else f"--min-interval-seconds {args.min_interval_seconds:g}"
    )
    return Interval(f, reason, min(optimum, N), floor_steps, floor_source, cap_steps, durable_steps)


def _overlap_warning(f: int, durable_steps: int, cost: SaveCost, size: Sizing, step: float) -> str:
    persist = cost.lag  # > C here: the save is asynchronous and slower than its stall
    text = (
        f"saves would overlap: every {f} steps starts a save each {f * step:.4g} s of training, but one save "
        f"takes {persist:.4g} s to reach storage"
    )
    if cost.write_gbps is not None and size.size_gb is not None:
        need = size.size_gb * (1.0 - cost.C / persist) / (f * step)
        text += (
            f" ({size.size_gb:.4g} GB at {cost.write_gbps:.4g} GB/s); every {f} steps needs at least "
            f"{need:.3g} GB/s"
        )
    return (
        text
        + f"; saving every {durable_steps} steps instead, the shortest interval the storage sustains"
    )


def align_milestones(args: PlanArguments, frequency: int, warnings: list[str]) -> list[int]:
    """Milestone steps. Named rules (seed, pow2) are rounded up to multiples of the interval so every
    milestone is a regular save; a list the user gave is kept and off-grid steps are warned about."""
    N = args.total_steps
    spec = (
        args.milestones if inputs.given(args, "milestones") else PRESETS[args.preset]["milestones"]
    )
    milestones = milestone_steps(spec, N)
    if isinstance(spec, list) and not inputs.given(args, "milestones"):
        milestones = sorted(
            {*milestones, N}
        )  # a preset's list, with the final step as the named rules
    elif isinstance(spec, list):
        if any(m > N for m in spec):
            warnings.append(f"milestones past total_steps {N} were dropped")
        off_grid = [m for m in milestones if m % frequency and m != N]
        if off_grid:
            warnings.append(
                f"milestones {_list(off_grid)} are not multiples of {frequency}: "
                "save an extra checkpoint at those steps"
            )
        return milestones
    return _on_grid(milestones, frequency, N)


def _on_grid(milestones: list[int], frequency: int, N: int) -> list[int]:
    return sorted({m if m == N else min(-(-m // frequency) * frequency, N) for m in milestones})


def retention(
    args: PlanArguments, size: Sizing, frequency: int, milestones: list[int], warnings: list[str]
) -> tuple[int, StorageBreakdown]:
    """keep_last and the storage it needs: the preset's window, widened in auto to cover the spike horizon,
    narrowed (not below 2) to fit the budget."""
    preset = PRESETS[args.preset]
    if args.keep_last is not None:
        keep_last = args.keep_last
    else:
        keep_last = preset["keep_last"]
        if args.preset == "auto":
            keep_last = min(
                MAX_KEEP_LAST_AUTO, max(keep_last, math.ceil(SPIKE_HORIZON_STEPS / frequency) + 1)
            )
    storage = _storage(
        size.size_gb,
        size.weights_gb,
        keep_last,
        milestones,
        args.total_steps,
        frequency,
        size.formats,
    )
    if args.keep_last is None and size.size_gb is not None:
        while keep_last > 2 and storage.total_gb > args.budget_gb:
            keep_last -= 1
            storage = _storage(
                size.size_gb,
                size.weights_gb,
                keep_last,
                milestones,
                args.total_steps,
                frequency,
                size.formats,
            )
        if keep_last < preset["keep_last"] and storage.total_gb <= args.budget_gb:
            warnings.append(
                f"keep_last lowered to {keep_last} to fit the {args.budget_gb:g} GB budget"
            )
    return keep_last, storage


def use_budget(
    args: PlanArguments,
    size: Sizing,
    frequency: int,
    milestones: list[int],
    keep_last: int,
    storage: StorageBreakdown,
) -> tuple[list[int], int, StorageBreakdown, str | None]:
    """The auto preset spends a budget the policy leaves unused: milestones every 1% of the run (on the
    interval's grid) and a wider rolling window (up to MAX_KEEP_LAST_AUTO), the peak within 80% of the budget.
    Returns the milestones, keep_last, storage and a sentence on the budget's use."""
    if size.size_gb is None or storage.total_gb is None:
        return milestones, keep_last, storage, None
    N, target, spacing = args.total_steps, inputs.BUDGET_SHARE * args.budget_gb, None
    if args.preset != "auto" or inputs.given(args, "frequency") or storage.total_gb >= target:
        return milestones, keep_last, storage, _budget_text(args, storage, spacing, keep_last)
    total = functools.partial(
        _total_gb,
        size.size_gb,
        size.weights_gb,
        total_steps=N,
        frequency=frequency,
        formats=size.formats,
    )
    auto = args.preset == "auto" and not inputs.given(args, "frequency")
    before = (milestones, keep_last)
    if auto and not inputs.given(args, "milestones") and storage.total_gb < target:
        # each new milestone costs a checkpoint (outside the window) and an export: start at the spacing that fits
        each = (storage.checkpoint_size_gb or size.size_gb) + (
            size.weights_gb or 0.0 if "safetensors" in size.formats else 0.0
        )
        room = max(1.0, (target - storage.total_gb) / each) if each > 0 else float(N)
        step = _on_grid([nice_ceil(max(N * inputs.MILESTONE_SHARE, N / room))], frequency, N)[0]
        while step < N:
            dense = sorted({*milestones, *range(step, N, step)})
            if len(dense) == len(milestones):
                break  # the seed steps are already this dense
            if total(keep_last=keep_last, milestones=dense) <= target:
                milestones, spacing = dense, step
                break
            step = _on_grid([nice_ceil(step + 1)], frequency, N)[0]
    now = total(keep_last=keep_last, milestones=milestones)
    if auto and not inputs.given(args, "keep_last") and now < target and size.size_gb > 0:
        per = storage.checkpoint_size_gb or size.size_gb
        grow = min(MAX_KEEP_LAST_AUTO, keep_last + int((target - now) // per))
        while grow > keep_last and total(keep_last=grow, milestones=milestones) > target:
            grow -= 1
        keep_last = max(keep_last, grow)
    if (milestones, keep_last) != before:
        storage = _storage(
            size.size_gb, size.weights_gb, keep_last, milestones, N, frequency, size.formats
        )
    return milestones, keep_last, storage, _budget_text(args, storage, spacing, keep_last)


def _budget_text(
    args: PlanArguments, storage: StorageBreakdown, spacing: int | None, keep_last: int
) -> str:
    total, budget = storage.total_gb or 0.0, args.budget_gb
    head = f"the policy needs {_gb(total)} of the {_gb(budget)} budget ({total / budget:.0%})"
    if args.preset != "auto":
        return (
            head
            + f": the {args.preset} preset keeps its template (keep_last {PRESETS[args.preset]['keep_last']}"
            f", its milestones); --preset auto spends a larger budget on denser milestones and a longer window"
        )
    if total > inputs.BUDGET_SHARE * budget:
        return head
    given = [
        o
        for o, n in (
            ("--frequency", "frequency"),
            ("--milestones", "milestones"),
            ("--keep-last", "keep_last"),
        )
        if inputs.given(args, n)
    ]
    dense = (
        ""
        if spacing is None
        else (
            f"milestones every {spacing} steps ({_h(spacing * args.step_seconds)}) "
            "besides the seed steps, "
        )
    )
    why = (
        f"the rest is left free: milestones no closer than {inputs.MILESTONE_SHARE:.0%} of the run, at most "
        f"{MAX_KEEP_LAST_AUTO} rolling checkpoints, the peak within {inputs.BUDGET_SHARE:.0%} of the budget"
    )
    if given:
        why = f"{' and '.join(given)} as given"
    return head + f": {dense}keep_last {keep_last}; {why}"


def policy_checks(
    args: PlanArguments,
    cost: SaveCost,
    size: Sizing,
    iv: Interval,
    keep_last: int,
    storage: StorageBreakdown,
    writes: StorageWrites,
    max_loss_h: float,
    wall_overhead: float,
    warnings: list[str],
) -> None:
    """Warnings about the final policy, however its interval was reached."""
    if keep_last < 2:
        warnings.append(
            "keep_last 1 cannot hold a validated rolling window: a corrupt newest checkpoint "
            "leaves nothing to roll back to"
        )
    if storage.total_gb is not None and storage.total_gb > args.budget_gb:
        warnings.append(
            f"budget too small: the policy needs {storage.total_gb:g} GB at peak but the budget is "
            f"{args.budget_gb:g} GB; raise the budget, drop milestones or safetensors exports, "
            "or accept a rolling window below 2 (no validated fallback)"
        )
    horizon = (
        keep_last - 1
    ) * iv.frequency  # the oldest kept save, seen from just after the newest one
    if horizon < SPIKE_HORIZON_STEPS:
        warnings.append(
            f"rolling window reaches back {horizon} steps ((keep_last {keep_last} - 1) x {iv.frequency}), "
            f"shorter than the spike horizon of {SPIKE_HORIZON_STEPS} steps ({SPIKE_WAIT_STEPS} waiting + "
            f"{SPIKE_MARGIN_STEPS} before onset): a spike may leave no checkpoint to roll back to; "
            f"keep at least {math.ceil(SPIKE_HORIZON_STEPS / iv.frequency) + 1} checkpoints"
        )
    if max_loss_h > args.max_loss_hours * (1 + 1e-9):
        warnings.append(_cap_warning(args, cost, size, iv, max_loss_h))
    if writes.storage_busy_fraction is not None and writes.storage_busy_fraction > WRITE_BUSY_WARN:
        warnings.append(
            f"the storage spends {writes.storage_busy_fraction:.0%} of the time writing checkpoints "
            f"({cost.persist:.4g} s per save, one every {iv.frequency * args.step_seconds + cost.C:.4g} "
            "s): leave bandwidth for data loading and other jobs, or save less often"
        )
    daily = writes.data_written_per_day_gb
    if daily is not None and daily > DAILY_BUDGET_WARN * args.budget_gb:
        warnings.append(
            f"the policy writes {_gb(daily)} of checkpoints a day, {daily / args.budget_gb:.3g}x the "
            f"{args.budget_gb:g} GB budget: check the storage's write endurance and delete rate, "
            "or save less often"
        )
    if wall_overhead > 0.5:
        warnings.append(
            f"the failure model expects the run to take {1 + wall_overhead:.3g}x its compute time: a "
            f"job MTBF of {cost.mtbf_h:.3g} h is short against saves of {cost.C:.3g} s and restarts "
            f"of {cost.R:.3g} s; use async saves, faster storage, fewer GPUs per job or a cheaper "
            "restart"
        )


def _cap_warning(
    args: PlanArguments, cost: SaveCost, size: Sizing, iv: Interval, max_loss_h: float
) -> str:
    head = f"max data loss {max_loss_h:.3g} h is over --max-loss-hours {args.max_loss_hours:g}"
    if (
        iv.reason == "frequency_option"
        and iv.cap_steps is not None
        and iv.cap_steps >= iv.durable_steps
    ):
        return (
            head + f" with --frequency {iv.frequency}: saving every {iv.cap_steps} steps keeps it"
        )
    if iv.cap_steps is not None and iv.cap_steps >= iv.durable_steps:
        return (
            head
            + f": {iv.reason.replace('_', ' ')} sets the interval; every {iv.cap_steps} steps keeps the cap"
        )
    if iv.cap_steps is None and cost.lag < args.max_loss_hours * 3600.0:
        return head + f": one step of {args.step_seconds:g} s is already beyond it"
    if iv.cap_steps is None:
        why = f"one save takes {cost.lag:.4g} s to reach storage, longer than the cap itself"
    else:
        why = (
            f"staying within it needs a save every {iv.cap_steps} steps, but one save takes "
            f"{cost.lag:.4g} s to reach storage"
        )
    if iv.durable_steps > 1:
        why += (
            f"; saves closer than {iv.durable_steps} steps would overlap (a save must be on storage before "
            f"the next starts), so every {iv.durable_steps} steps is as close to the cap as the storage "
            "sustains"
        )
    text = head + ": " + why
    if cost.write_gbps is not None and size.size_gb is not None and cost.lag > 0:
        need = size.size_gb * (2.0 - cost.C / cost.lag) / (args.max_loss_hours * 3600.0)
        text += f"; keeping the cap needs about {need:.3g} GB/s (now {cost.write_gbps:.4g}) or a faster local tier"
    return text


def storage_writes(
    args: PlanArguments, cost: SaveCost, storage: StorageBreakdown, frequency: int
) -> StorageWrites:
    """Data written per day of training and the share of time the storage is busy writing checkpoints."""
    period = frequency * args.step_seconds + cost.C
    daily = busy = None
    if storage.checkpoint_size_gb is not None:
        daily = _r(storage.checkpoint_size_gb * 86400.0 / period)
    if cost.persist is not None:
        busy = _r(min(1.0, cost.persist / period))
    return StorageWrites.model_construct(
        write_gbps=None if cost.write_gbps is None else _r(cost.write_gbps),
        write_source=cost.write_source,
        nodes=cost.nodes,
        gpus_per_node=args.gpus_per_node,
        data_written_per_day_gb=daily,
        storage_busy_fraction=busy,
    )


def rounding_note(args: PlanArguments, cost: SaveCost, iv: Interval) -> str:
    """When the chosen interval is not the exact optimum because of plain rounding: say so, with both
    numbers ("optimum 732 steps (25.6 min), rounded to 1000"). Other reasons already name their cause."""
    exact = cost.tau_exact / args.step_seconds
    if (
        not math.isfinite(exact)
        or exact <= 0
        or round(exact) == iv.frequency
        or iv.frequency * args.step_seconds <= 0
    ):
        return ""
    minutes = cost.tau_exact / 60.0
    when = f"{minutes:.1f} min" if minutes < 60 else f"{minutes / 60:.2f} h"
    if iv.reason == "failure_model_optimum":
        return (
            f"; optimum {exact:.0f} steps ({when}), rounded to {iv.frequency} (a round number of steps: "
            f"{overhead(iv.frequency * args.step_seconds, cost):.2%} expected overhead against "
            f"{overhead(cost.tau_exact, cost):.2%} at the exact optimum)"
        )
    if round(exact) == iv.optimum_steps:
        return f"; the exact optimum is {exact:.0f} steps ({when})"
    # the price of the round number itself (issue 42: a 1470-step optimum shown only as 2000)
    return (
        f"; the exact optimum is {exact:.0f} steps ({when}, {overhead(cost.tau_exact, cost):.3%} expected "
        f"overhead), {iv.optimum_steps} as a round number "
        f"({overhead(iv.optimum_steps * args.step_seconds, cost):.3%})"
    )


def interval_choice(
    args: PlanArguments, cost: SaveCost, iv: Interval, chosen_overhead: float
) -> IntervalChoice:
    """The reason for the interval and its price against the unconstrained optimum."""
    step = args.step_seconds
    opt_over = overhead(iv.optimum_steps * step, cost)
    opt_loss = (iv.optimum_steps * step + cost.lag) / 3600.0
    price = (
        f"{chosen_overhead:.2%} expected overhead against {opt_over:.2%} at the failure-model optimum of "
        f"{iv.optimum_steps} steps"
    )
    text = {
        "failure_model_optimum": "the failure-model optimum (exact minimiser of Daly 2006)",
        "max_loss_cap": f"the --max-loss-hours {args.max_loss_hours:g} cap: {price}; the cap costs "
        f"{(chosen_overhead - opt_over) * 100:.2g} points, --max-loss-hours {_ceil2(opt_loss):g} "
        f"gives {opt_over:.2%}",
        "preset": f"the {args.preset} preset's limit: {price}",
        "frequency_option": f"--frequency {iv.frequency}: {price}",
        "storage_floor": f"the storage: a save is on storage {cost.lag:.4g} s after it starts, so saves are no closer"
        + (
            f" (the nearest to the --max-loss-hours {args.max_loss_hours:g} cap it sustains)"
            if args.frequency is None and iv.optimum_steps > iv.frequency
            else ""
        )
        + f"; {price}",
        "min_interval": f"--min-interval-seconds {args.min_interval_seconds:g}: {price}",
        "total_steps": f"the run's length: one save at the end; {price}",
    }[iv.reason] + rounding_note(args, cost, iv)
    return IntervalChoice.model_construct(
        reason=iv.reason,
        explanation=text,
        optimum_steps=iv.optimum_steps,
        optimum_overhead_fraction=_r(opt_over),
        optimum_max_data_loss_hours=_r(opt_loss),
        min_interval_steps=iv.floor_steps,
        min_interval_source=iv.floor_source,
        max_loss_cap_steps=iv.cap_steps,
    )


def plan(args: PlanArguments) -> PlanReport:
    """Training-run numbers in, checkpointing policy out: size, save cost, interval, retention, risk.
    With --local-tier, the persistent tier is this plan for node losses and planning/tiers.py adds the local one."""
    if args.local_tier is not None:
        return two_tier_plan(args)
    warnings: list[str] = []
    size = size_step(args, warnings)
    cost = save_cost(args, size, warnings)
    iv = choose_interval(args, cost, size, warnings)
    frequency, tau = iv.frequency, iv.frequency * args.step_seconds
    milestones = align_milestones(args, frequency, warnings)
    keep_last, storage = retention(args, size, frequency, milestones, warnings)
    milestones, keep_last, storage, budget_use = use_budget(
        args, size, frequency, milestones, keep_last, storage
    )
    over = overhead(tau, cost)
    wall = args.total_steps * args.step_seconds * (1.0 + over)
    max_loss_h = (tau + cost.lag) / 3600.0
    writes = storage_writes(args, cost, storage, frequency)
    policy_checks(args, cost, size, iv, keep_last, storage, writes, max_loss_h, over, warnings)
    assumed = _assumptions(args, size, cost, iv, warnings)
    return PlanReport.model_construct(
        total_steps=args.total_steps,
        step_seconds=args.step_seconds,
        total_training_hours=_r(args.total_steps * args.step_seconds / 3600.0),
        storage_budget_gb=args.budget_gb,
        model_size_gb=_weights_size(args, size.params, size.precision),
        params=size.params,
        precision=size.precision,
        preset=args.preset,
        checkpoint_size_gb=storage.checkpoint_size_gb,
        frequency_steps=frequency,
        frequency_hours=_r(tau / 3600.0),
        keep_last=keep_last,
        milestone_steps=milestones,
        rolling_storage_gb=storage.rolling_gb,
        total_storage_gb=storage.total_gb,
        fits_budget=None if storage.total_gb is None else storage.total_gb <= args.budget_gb,
        storage_breakdown=storage,
        max_data_loss_hours=_r(max_loss_h),
        rollback_points=keep_last + storage.milestones_outside_window,
        rollback_horizon_steps=keep_last * frequency,
        expected_overhead_fraction=_r(over),
        expected_wall_hours=_r(wall / 3600.0),
        expected_failures=_r(failure.expected_failures(wall, cost.M)),
        optimal_interval_seconds=_r(cost.tau_exact, 3),
        optimal_interval_steps=_optimal_steps(args, cost),
        failure_model=_failure_model(args, cost),
        interval=interval_choice(args, cost, iv, over),
        storage_writes=writes,
        policy=_policy(args, size, cost, frequency, keep_last, milestones),
        warnings=warnings,
        sources=SOURCES,
        two_tier=None,
        run_length=_run_length(args),
        assumptions=assumed,
        formats_reason=inputs.formats_reason(args, size, cost),
        budget_use=budget_use,
    )


def _assumptions(
    args: PlanArguments, size: Sizing, cost: SaveCost, iv: Interval, warnings: list[str]
) -> list[Assumption]:
    """The inputs the plan assumed, with one warning when they set the interval."""
    assumed = inputs.assumptions(args, size, cost, iv)
    if (note := inputs.assumption_warning(assumed)) is not None:
        warnings.append(note)
    return assumed


def _optimal_steps(args: PlanArguments, cost: SaveCost) -> float:
    """The exact optimum in steps, 3 decimals (the whole run when saving never pays)."""
    opt_steps = cost.tau_exact / args.step_seconds
    return _r(opt_steps, 3) if math.isfinite(opt_steps) else float(args.total_steps)


def _failure_model(args: PlanArguments, cost: SaveCost) -> FailureModel:
    return FailureModel.model_construct(
        mtbf_hours=_r(cost.mtbf_h),
        mtbf_source=cost.mtbf_source,
        gpus=args.gpus,
        checkpoint_write_seconds=_r(cost.C),
        persist_seconds=None if cost.persist is None else _r(cost.persist),
        restart_seconds=cost.R,
        async_save=cost.async_save,
        young_interval_seconds=_r(cost.tau_young, 3),
        daly_interval_seconds=_r(cost.tau_daly, 3),
        optimal_interval_seconds=_r(cost.tau_exact, 3),
    )


def _policy(
    args: PlanArguments,
    size: Sizing,
    cost: SaveCost,
    frequency: int,
    keep_last: int,
    milestones: list[int],
) -> CheckpointPolicy:
    return CheckpointPolicy.model_construct(
        frequency=f"every_{frequency}_steps",
        keep_last=keep_last,
        keep_milestone=milestones,
        save_optimizer=args.save_optimizer,
        save_formats=size.formats,
        validate_on_save=True,
        async_save=cost.async_save,
        emergency_save_on=PRESETS[args.preset]["emergency"],
    )


def _run_length(args: PlanArguments) -> str | None:
    if args.duration_hours is None:
        return None
    h = args.duration_hours
    named = next(
        (
            f"{h / d:g} {unit}"
            for d, unit in ((168, "weeks"), (24, "days"))
            if h >= d and float(h / d).is_integer()
        ),
        f"{h:g} h",
    )
    text = f"--duration {named}: {h:g} h at {args.step_seconds:g} s a step"
    steps = round(h * 3600.0 / args.step_seconds)
    return (
        text
        if steps == args.total_steps
        else text + f" is {steps} steps; TOTAL_STEPS {args.total_steps} kept"
    )


def two_tier_plan(args: PlanArguments) -> PlanReport:
    """Two tiers: the persistent plan for node losses, the local tier beside it (planning/tiers.py)."""
    base = plan(tiers.persistent_arguments(args))
    warnings = list(base.warnings)
    plan2 = tiers.two_tier(args, base, warnings)
    fm = base.failure_model.model_copy(
        update={
            "mtbf_source": f"node losses only: job MTBF {plan2.job_mtbf_hours:.4g} h / --node-loss-fraction "
            f"{args.node_loss_fraction:g} (the local tier covers the other failures)"
        }
    )
    return tiers.apply(base.model_copy(update={"warnings": warnings, "failure_model": fm}), plan2)


def _weights_size(args: PlanArguments, params, precision):
    if args.model_size_gb is not None:
        return args.model_size_gb
    return None if params is None else _r(sizing.weights_gb(params, precision))


def _h(seconds: float) -> str:
    h = seconds / 3600.0
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"


def _list(xs: list[int]) -> str:
    return ", ".join(str(x) for x in xs[:6]) + (", ..." if len(xs) > 6 else "")


def _gb(x: float) -> str:
    for unit, scale in (("PB", 1e6), ("TB", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} GB"


def _ceil2(x: float) -> float:
    """Round up to two significant digits (a cap that the optimum meets)."""
    if x <= 0:
        return x
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / scale - 1e-9) * scale
