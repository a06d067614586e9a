"""`validate --target-gpus N`: a hardware move re-plans.

The job's failure rate scales with its GPU count (the planner's model: job MTBF = per-GPU MTBF / GPUs, Llama 3's
50,000 GPU-hours per GPU), and Daly's optimal interval grows as sqrt(2 x save stall x MTBF) (planning/failure.py):
moving from W to N GPUs changes the MTBF by W/N and the interval in time by about sqrt(W/N); the interval in steps
also moves with the new step time. The checkpoints cannot tell the new step time or the storage budget, so the
re-plan is the `plan` command with what the run folder does tell (max_steps, the weights' size) filled in.
"""

from __future__ import annotations

import math
import os
from typing import Optional

from checkpoint_strategy.formats.runlog import run_facts
from checkpoint_strategy.planning.planner import DEFAULT_GPU_MTBF_HOURS


def weights_gb(checkpoint: str) -> Optional[float]:
    """GB (1e9 bytes) of the *.safetensors weights in one local checkpoint folder, when there are any."""
    try:
        names = (
            [n for n in os.listdir(checkpoint) if n.endswith(".safetensors")]
            if os.path.isdir(checkpoint)
            else []
        )
        total = sum(os.path.getsize(os.path.join(checkpoint, n)) for n in names)
    except OSError:
        return None
    return total / 1e9 if total else None


def replan_lines(
    saved: Optional[int], target: int, max_steps: Optional[int], weights: Optional[float]
) -> list[str]:
    """What the move does to the failure model and the interval, and the plan command for the new hardware."""
    mtbf = DEFAULT_GPU_MTBF_HOURS / target
    line = (
        f"failure rate: job MTBF {DEFAULT_GPU_MTBF_HOURS:g} GPU-hours per GPU (Llama 3) / {target} GPUs = "
        f"{mtbf:.6g} h"
    )
    out = []
    if saved is not None and saved != target:
        line += (
            f", was {DEFAULT_GPU_MTBF_HOURS / saved:.6g} h on {saved}: failures come {target / saved:.3g}x as "
            "often"
        )
        out.append(line)
        out.append(
            f"interval: Daly's optimum grows as sqrt(2 x save stall x MTBF): at the same save stall the time "
            f"between saves becomes about {math.sqrt(saved / target):.2f}x as long; in steps it also divides "
            "by the new step time (and the save stall changes with the new write bandwidth)"
        )
    else:
        out.append(line)
    size = f"{weights:.3g}" if weights is not None and weights >= 0.001 else "WEIGHTS_GB"
    steps = str(max_steps) if max_steps is not None else "TOTAL_STEPS"
    out.append(
        f"command: checkpoint-strategy plan {steps} NEW_STEP_SECONDS BUDGET_GB "
        f"--model-size-gb {size} --gpus {target}   (NEW_STEP_SECONDS: the step time measured on {target} GPUs)"
    )
    return out


def add_replan(report, log: Optional[str] = None) -> None:
    """Fill report.hardware_move.replan (validate --target-gpus) from the newest valid checkpoint."""
    move = report.hardware_move
    if move is None:
        return
    valid = [c for c in report.checkpoints if c.status == "valid"]
    newest = max(valid, key=lambda c: c.step or 0) if valid else None
    state = log or (os.path.join(newest.path, "trainer_state.json") if newest is not None else None)
    facts = run_facts(state if state is not None and os.path.exists(state) else None)
    move.replan = replan_lines(
        move.saved_world_size,
        move.target_gpus,
        facts.int("max_steps"),
        weights_gb(newest.path) if newest is not None else None,
    )
