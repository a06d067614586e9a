"""Two-tier plans (`--local-tier GB,GBPS`): frequent saves to node-local storage, rarer ones to persistent storage.

The model (seconds; first order, as Young 1974, so each figure can be checked by hand):
- A checkpoint is sharded over the job's nodes: each node holds size / nodes GB of it. The local tier writes
  that shard at the node-local rate, the persistent tier writes the whole checkpoint at the job's write rate.
- Failures arrive at the job MTBF M. A fraction phi of them lose a node and with it that node's local
  checkpoints (`--node-loss-fraction`, default 0.78: the Llama 3 paper attributes about 78% of its 419
  unexpected interruptions to hardware); those roll back to the newest persistent checkpoint. The others
  (software, network, a restarted job on the same nodes) restart from the newest local one.
- The local interval is the failure model's optimum for the local tier's cost against all failures (Daly
  2006's exact optimum for C_local and M); the persistent interval is the single-tier plan for node losses
  only (job MTBF M / phi), with its cap, floor and preset; the local interval is then lowered to a divisor of
  the persistent one, so every persistent save is also a local save point.
- Expected overhead = C_l / tau_l + C_p / tau_p + ((1 - phi) (tau_l / 2 + lag_l) + phi (tau_p / 2 + lag_p)
  + R) / M, where lag is the time from a save's start until it is on its storage (async saves).
- Local keep_last = what fits the node-local space: floor(GB / shard) - 1 (one more is written before the
  oldest goes), at most 10.

Sources: Orbax's emergency checkpoint manager (local every few steps, persistent every ~1000) and
nvidia-resiliency-ext / NeMo local checkpointing describe the same two tiers.
"""

from __future__ import annotations

import math

from checkpoint_strategy.planning import failure
from checkpoint_strategy.planning.models import (
    LocalTierPlan,
    PlanArguments,
    PlanReport,
    TierPlan,
    TwoTierPlan,
)
from checkpoint_strategy.planning.policytiers import PolicyTier, PolicyTiers
from checkpoint_strategy.planning.rounding import nice_ceil, nice_floor, nice_steps

MAX_LOCAL_KEEP = 10
# Llama 3 (Dubey et al. 2024, sec. 3.3.4): about 78% of unexpected interruptions were hardware issues.
DEFAULT_NODE_LOSS_FRACTION = 0.78


def persistent_arguments(args: PlanArguments) -> PlanArguments:
    """The single-tier plan's arguments for the persistent tier: failures are the node losses only."""
    M = args.mtbf_hours if args.mtbf_hours is not None else args.gpu_mtbf_hours / args.gpus
    out = args.model_copy(update={"mtbf_hours": M / args.node_loss_fraction, "local_tier": None})
    out.__pydantic_fields_set__ = set(
        args.model_fields_set
    )  # what the user gave (the plan lists the rest as assumed)
    return out


def two_tier(args: PlanArguments, persistent: PlanReport, warnings: list[str]) -> TwoTierPlan:
    """The local tier next to the persistent plan, and the combined risk figures."""
    tier = args.local_tier
    assert tier is not None
    fm = persistent.failure_model
    M = fm.mtbf_hours * 3600.0 * args.node_loss_fraction  # the job MTBF: all failures
    nodes = persistent.storage_writes.nodes
    size = persistent.storage_breakdown.checkpoint_size_gb
    shard = None if size is None else size / nodes
    async_save = fm.async_save
    P_l, C_l = _local_save_cost(shard, tier.gbps_per_node, async_save, warnings)
    lag_l = P_l if async_save else 0.0
    step = args.step_seconds
    opt = failure.exact_interval(C_l, M) / step
    local_f = nice_steps(opt) if math.isfinite(opt) else persistent.frequency_steps
    durable = nice_ceil(max(0.0, lag_l - C_l) / step) if lag_l > C_l else 1
    pers_f = persistent.frequency_steps
    local_f = divisor_at_most(pers_f, max(min(local_f, pers_f), durable, 1))
    keep_local = _local_keep(shard, tier.gb_per_node, warnings)
    phi = args.node_loss_fraction
    tau_l, tau_p = local_f * step, pers_f * step
    C_p, lag_p = fm.checkpoint_write_seconds, (fm.persist_seconds or 0.0) if async_save else 0.0
    lost = _lost_per_failure(phi, tau_l, lag_l, tau_p, lag_p, fm.restart_seconds)
    overhead = C_l / tau_l + C_p / tau_p + lost / M
    local = LocalTierPlan(
        frequency_steps=local_f,
        keep_last=keep_local,
        shard_gb=None if shard is None else _r(shard),
        gb_per_node=tier.gb_per_node,
        gbps_per_node=tier.gbps_per_node,
        storage_per_node_gb=None if shard is None else _r((keep_local + 1) * shard),
        checkpoint_write_seconds=_r(C_l),
        persist_seconds=_r(P_l),
        max_data_loss_hours=_r((tau_l + lag_l) / 3600.0),
        failures_covered_fraction=_r(1 - phi),
        optimal_interval_steps=_r(opt, 3) if math.isfinite(opt) else float(pers_f),
    )
    pers = TierPlan(
        frequency_steps=pers_f,
        keep_last=persistent.keep_last,
        storage_gb=persistent.total_storage_gb,
        checkpoint_write_seconds=fm.checkpoint_write_seconds,
        persist_seconds=fm.persist_seconds,
        max_data_loss_hours=persistent.max_data_loss_hours,
        failures_covered_fraction=_r(phi),
    )
    return TwoTierPlan(
        local=local,
        persistent=pers,
        node_loss_fraction=phi,
        job_mtbf_hours=_r(M / 3600.0),
        expected_overhead_fraction=_r(overhead),
        expected_lost_hours_per_failure=_r(lost / 3600.0),
    )


def _local_save_cost(
    shard: float | None, gbps_per_node: float, async_save: bool, warnings: list[str]
) -> tuple[float, float]:
    """The local save's time to disk and the stall it costs training (1 s each when the size is unknown)."""
    if shard is None:
        warnings.append("model size missing: the local tier's save cost is assumed 1 s")
        return 1.0, 1.0
    P_l = shard / gbps_per_node
    return P_l, P_l * (0.1 if async_save else 1.0)


def _local_keep(shard: float | None, gb_per_node: float, warnings: list[str]) -> int:
    """How many local saves fit beside the one being written (capped), with a warning under two."""
    keep_local = 1 if shard is None else int(gb_per_node // shard) - 1
    if keep_local < 1 and shard is not None:
        warnings.append(
            f"the local tier holds no checkpoint: a {shard:.3g} GB shard per node needs at least "
            f"{2 * shard:.3g} GB of node-local space (one written before the oldest goes)"
        )
        keep_local = 0
    elif keep_local == 1:
        warnings.append(
            "the local tier holds one checkpoint: a corrupt newest local save leaves only the "
            "persistent tier; give it room for two"
        )
    return min(keep_local, MAX_LOCAL_KEEP)


def _lost_per_failure(
    phi: float, tau_l: float, lag_l: float, tau_p: float, lag_p: float, restart: float
) -> float:
    """Seconds lost per failure: half an interval plus the persist lag of the tier that resumes, plus the restart."""
    return (1 - phi) * (tau_l / 2 + lag_l) + phi * (tau_p / 2 + lag_p) + restart


def divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is at most cap: a round one when there is one, else by trial division."""
    d = cap
    while d > 1 and n % d:
        d = nice_floor(d - 1)
    if d * 10 >= cap:
        return d
    best, i = d, 1
    while i * i <= n:
        if n % i == 0:
            for v in (i, n // i):
                if best < v <= cap:
                    best = v
        i += 1
    return best


def apply(report: PlanReport, plan2: TwoTierPlan) -> PlanReport:
    """The persistent plan's report with the two tiers: policy tiers block and the combined risk."""
    total = report.total_steps * report.step_seconds
    wall = total * (1 + plan2.expected_overhead_fraction)
    tiers = PolicyTiers(
        local=PolicyTier(
            frequency=f"every_{plan2.local.frequency_steps}_steps", keep_last=plan2.local.keep_last
        ),
        persistent=PolicyTier(frequency=report.policy.frequency, keep_last=report.policy.keep_last),
    )
    return report.model_copy(
        update={
            "two_tier": plan2,
            "policy": report.policy.model_copy(update={"tiers": tiers}),
            "expected_overhead_fraction": plan2.expected_overhead_fraction,
            "expected_wall_hours": _r(wall / 3600.0),
            "expected_failures": _r(wall / (plan2.job_mtbf_hours * 3600.0)),
        }
    )


def _r(x: float, nd: int = 6) -> float:
    return float(round(x, nd))
