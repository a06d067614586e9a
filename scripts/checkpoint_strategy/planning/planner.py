"""The planner: training-run numbers in, checkpointing policy out. Pure functions."""

from __future__ import annotations

import math

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning import failure, sizing
from checkpoint_strategy.planning.models import (
    CheckpointPolicy,
    FailureModel,
    PlanArguments,
    PlanReport,
    StorageBreakdown,
)

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

PRESETS = {
    # the spec's two templates; "auto" takes the failure-model optimum with the conservative
    # retention and both emergency triggers.
    "conservative": {"max_frequency": 500, "keep_last": 10, "emergency": []},
    "aggressive": {"max_frequency": 2000, "keep_last": 5,
                   "emergency": ["loss_spike_detected", "gradient_norm_exceeded"]},
    "auto": {"max_frequency": None, "keep_last": 10,
             "emergency": ["loss_spike_detected", "gradient_norm_exceeded"]},
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

_NICE = (1, 2, 2.5, 5)


def nice_steps(x: float) -> int:
    """Round to the nearest 1, 2, 2.5 or 5 x 10^k (in log space), at least 1 step."""
    if x <= 1:
        return 1
    best, best_err = 1, float("inf")
    k = int(math.floor(math.log10(x)))
    for exp in (k - 1, k, k + 1):
        for m in _NICE:
            v = m * 10**exp
            if v < 1 or not float(v).is_integer():
                continue
            err = abs(math.log(v / x))
            if err < best_err:
                best, best_err = int(v), err
    return best


def nice_floor(x: float) -> int:
    """The largest 1, 2, 2.5 or 5 x 10^k that is <= x (at least 1)."""
    if x < 1:
        return 1
    k = int(math.floor(math.log10(x)))
    best = 1
    for exp in (k - 1, k):
        for m in _NICE:
            v = m * 10**exp
            if float(v).is_integer() and best < v <= x:
                best = int(v)
    return best


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
        return StorageBreakdown.model_construct(checkpoint_size_gb=None, rolling_gb=None, in_flight_gb=None, milestones_gb=None,
                                milestones_outside_window=len(outside), safetensors_exports_gb=None,
                                safetensors_exports=exports, total_gb=None)
    per = size * resume_copies
    rolling = keep_last * per
    in_flight = per
    ms = len(outside) * per
    ex = exports * weights
    return StorageBreakdown.model_construct(checkpoint_size_gb=_r(per), rolling_gb=_r(rolling), in_flight_gb=_r(in_flight),
                            milestones_gb=_r(ms), milestones_outside_window=len(outside),
                            safetensors_exports_gb=_r(ex), safetensors_exports=exports,
                            total_gb=_r(rolling + in_flight + ms + ex))


def _r(x: float, nd: int = 6) -> float:
    return float(round(x, nd))


def plan(args: PlanArguments) -> PlanReport:  # noqa: C901 - complexity debt, see issue 10
    warnings: list[str] = []
    preset = PRESETS[args.preset]
    total_seconds = args.total_steps * args.step_seconds

    # --- size -------------------------------------------------------------------------
    params = sizing.resolve_params(args.params, args.model_size_gb, args.weights_dtype)
    precision = sizing.resolve_precision(args.precision, args.weights_dtype) if params is not None else args.precision
    size = weights = None
    if params is not None:
        size = sizing.checkpoint_gb(params, precision, args.save_optimizer)
        weights = sizing.weights_gb(params, precision)
    else:
        warnings.append("model size missing: storage is unknown; give --model_size_gb N or --params 7B")
    if not args.save_optimizer:
        warnings.append("optimizer state not saved: resuming restarts Adam's moments from zero "
                        "(the spec's lesson 2); use it only for inference exports")

    formats = list(args.formats) if args.formats else ["full_state_dict", "safetensors"]
    if not any(f in ("full_state_dict", "sharded") for f in formats):
        warnings.append("no resumable format in --formats: add full_state_dict (or sharded) to resume training")
    elif "full_state_dict" not in formats:
        warnings.append("only sharded (FSDP/DCP) checkpoints: they are hardware-specific; add full_state_dict "
                        "before migrating hardware, then re-shard after loading")

    # --- failure model ----------------------------------------------------------------
    async_save = True if args.async_save is None else args.async_save
    if args.mtbf_hours is not None:
        mtbf_h, mtbf_source = args.mtbf_hours, "--mtbf-hours"
    else:
        mtbf_h = args.gpu_mtbf_hours / args.gpus
        mtbf_source = f"{args.gpu_mtbf_hours:g} GPU-hours per GPU (Llama 3) / {args.gpus} GPUs"
    M = mtbf_h * 3600.0
    persist = None
    if args.checkpoint_write_seconds is not None:
        C = args.checkpoint_write_seconds
        persist = C
    elif size is not None:
        persist = size / args.write_gbps
        C = persist * (ASYNC_BLOCKING_FRACTION if async_save else 1.0)
    else:
        C = UNKNOWN_SIZE_WRITE_SECONDS
        warnings.append(f"checkpoint cost unknown: assumed {UNKNOWN_SIZE_WRITE_SECONDS:g} s per save; "
                        "give --checkpoint-write-seconds or the model size")
    R = args.restart_seconds
    tau_exact = failure.exact_interval(C, M)
    tau_young = failure.young_interval(C, M)
    tau_daly = failure.daly_interval(C, M)

    # --- frequency --------------------------------------------------------------------
    opt_steps = tau_exact / args.step_seconds
    if args.frequency is not None:
        frequency = args.frequency
    else:
        frequency = nice_steps(opt_steps) if math.isfinite(opt_steps) else args.total_steps
        max_loss_steps = args.max_loss_hours * 3600.0 / args.step_seconds
        if frequency > max_loss_steps:
            capped = nice_floor(max_loss_steps)
            warnings.append(f"interval {frequency} steps ({_h(frequency * args.step_seconds)}) is beyond "
                            f"--max-loss-hours {args.max_loss_hours:g}: saving every {capped} steps instead")
            frequency = capped
        if preset["max_frequency"] is not None and frequency > preset["max_frequency"]:
            warnings.append(f"the {args.preset} preset saves at least every {preset['max_frequency']} steps "
                            f"(the failure-model optimum is {frequency})")
            frequency = preset["max_frequency"]
    if frequency > args.total_steps:
        warnings.append(f"total_steps {args.total_steps} is below the interval {frequency}: "
                        f"only the final checkpoint would be written; saving every {args.total_steps} steps")
        frequency = args.total_steps
    tau = frequency * args.step_seconds

    # --- milestones and retention -----------------------------------------------------
    milestones = milestone_steps(args.milestones, args.total_steps)
    if isinstance(args.milestones, list) and any(m > args.total_steps for m in args.milestones):
        warnings.append(f"milestones past total_steps {args.total_steps} were dropped")
    off_grid = [m for m in milestones if m % frequency and m != args.total_steps]
    if off_grid:
        warnings.append(f"milestones {_list(off_grid)} are not multiples of {frequency}: "
                        "save an extra checkpoint at those steps")
    if args.keep_last is not None:
        keep_last = args.keep_last
    else:
        keep_last = preset["keep_last"]
        if args.preset == "auto":
            keep_last = min(MAX_KEEP_LAST_AUTO, max(keep_last, math.ceil(SPIKE_HORIZON_STEPS / frequency) + 1))
    storage = _storage(size, weights, keep_last, milestones, args.total_steps, frequency, formats)
    if args.keep_last is None and size is not None:
        while keep_last > 2 and storage.total_gb > args.budget_gb:
            keep_last -= 1
            storage = _storage(size, weights, keep_last, milestones, args.total_steps, frequency, formats)
        if keep_last < preset["keep_last"] and storage.total_gb <= args.budget_gb:
            warnings.append(f"keep_last lowered to {keep_last} to fit the {args.budget_gb:g} GB budget")
    if keep_last < 2:
        warnings.append("keep_last 1 cannot hold a validated rolling window: a corrupt newest checkpoint "
                        "leaves nothing to roll back to")
    fits = None
    if storage.total_gb is not None:
        fits = storage.total_gb <= args.budget_gb
        if not fits:
            warnings.append(f"budget too small: the policy needs {storage.total_gb:g} GB at peak but the budget is "
                            f"{args.budget_gb:g} GB; raise the budget, drop milestones or safetensors exports, "
                            "or accept a rolling window below 2 (no validated fallback)")
    horizon = keep_last * frequency
    if horizon < SPIKE_HORIZON_STEPS:
        warnings.append(f"rolling window covers {horizon} steps (keep_last {keep_last} x {frequency}), shorter "
                        f"than the spike horizon of {SPIKE_HORIZON_STEPS} steps ({SPIKE_WAIT_STEPS} waiting + "
                        f"{SPIKE_MARGIN_STEPS} before onset): a spike may leave no checkpoint to roll back to; "
                        f"keep at least {math.ceil(SPIKE_HORIZON_STEPS / frequency)} checkpoints")

    # --- risk -------------------------------------------------------------------------
    max_loss_h = (tau + (persist if async_save and persist is not None else 0.0)) / 3600.0
    try:
        overhead = failure.overhead_fraction(tau, C, R, M)
        wall = total_seconds * (1.0 + overhead)
        if not math.isfinite(wall) or not math.isfinite(failure.expected_failures(wall, M)):
            raise OverflowError
    except OverflowError:
        raise UsageError(
            f"the failure model says this run never finishes: a job MTBF of {mtbf_h:g} h against a restart of "
            f"{R:g} s and saves costing {C:g} s every {tau:g} s; expected --mtbf-hours well above the restart "
            "and save times (or fewer --gpus)") from None
    rollback_points = keep_last + storage.milestones_outside_window
    if overhead > 0.5:
        warnings.append(f"the failure model expects the run to take {1 + overhead:.3g}x its compute time: a job MTBF "
                        f"of {mtbf_h:.3g} h is short against saves of {C:.3g} s and restarts of {R:.3g} s; use "
                        "async saves, faster storage, fewer GPUs per job or a cheaper restart")

    policy = CheckpointPolicy.model_construct(
        frequency=f"every_{frequency}_steps",
        keep_last=keep_last,
        keep_milestone=milestones,
        save_optimizer=args.save_optimizer,
        save_formats=formats,
        validate_on_save=True,
        async_save=async_save,
        emergency_save_on=preset["emergency"],
    )
    fm = FailureModel.model_construct(
        mtbf_hours=_r(mtbf_h), mtbf_source=mtbf_source, gpus=args.gpus,
        checkpoint_write_seconds=_r(C), persist_seconds=None if persist is None else _r(persist),
        restart_seconds=R, async_save=async_save,
        young_interval_seconds=_r(tau_young, 3), daly_interval_seconds=_r(tau_daly, 3),
        optimal_interval_seconds=_r(tau_exact, 3),
    )
    return PlanReport.model_construct(
        total_steps=args.total_steps,
        step_seconds=args.step_seconds,
        total_training_hours=_r(total_seconds / 3600.0),
        storage_budget_gb=args.budget_gb,
        model_size_gb=_weights_size(args, params, precision),
        params=params,
        precision=precision,
        preset=args.preset,
        checkpoint_size_gb=storage.checkpoint_size_gb,
        frequency_steps=frequency,
        frequency_hours=_r(tau / 3600.0),
        keep_last=keep_last,
        milestone_steps=milestones,
        rolling_storage_gb=storage.rolling_gb,
        total_storage_gb=storage.total_gb,
        fits_budget=fits,
        storage_breakdown=storage,
        max_data_loss_hours=_r(max_loss_h),
        rollback_points=rollback_points,
        rollback_horizon_steps=horizon,
        expected_overhead_fraction=_r(overhead),
        expected_wall_hours=_r(wall / 3600.0),
        expected_failures=_r(failure.expected_failures(wall, M)),
        optimal_interval_seconds=_r(tau_exact, 3),
        optimal_interval_steps=_r(opt_steps, 3) if math.isfinite(opt_steps) else float(args.total_steps),
        failure_model=fm,
        policy=policy,
        warnings=warnings,
        sources=SOURCES,
    )


def _weights_size(args: PlanArguments, params, precision):
    if args.model_size_gb is not None:
        return args.model_size_gb
    return None if params is None else _r(sizing.weights_gb(params, precision))


def _h(seconds: float) -> str:
    h = seconds / 3600.0
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.2f} h"


def _list(xs: list[int]) -> str:
    return ", ".join(str(x) for x in xs[:6]) + (", ..." if len(xs) > 6 else "")
