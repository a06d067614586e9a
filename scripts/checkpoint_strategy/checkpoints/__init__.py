"""Checkpoint validation and validated retention (`validate`, `prune`).

Python API for training scripts (the spec's ``validate_on_save``)::

    from checkpoint_strategy.checkpoints import validate_checkpoint
    result = validate_checkpoint("out/checkpoint-500", level="quick")
    if result.status != "valid":
        ...  # result.problems: [{file, reason, kind}]

Retention (the keep rules shared by prune, the callbacks and any other storage)::

    from checkpoint_strategy.checkpoints import Candidate, Retention, plan_prune
    plan = plan_prune(candidates, Retention(keep_last=3, milestones=frozenset({1000})))

Resume checks (read as opcodes; verify-resume --checkpoints, and a callback at resume time)::

    from checkpoint_strategy.checkpoints.optstep import read_optimizer_steps, judge
    judge(read_optimizer_steps("out/checkpoint-1200"), resume_step=1000).verdict   # "reset" when Adam restarted
    from checkpoint_strategy.checkpoints.runshape import check_resume_shape
    check_resume_shape("out/checkpoint-1000", world_size=1)   # ["global batch changed ... accumulation to 2 ..."]

Nothing here imports torch, and no checkpoint content is ever executed.
"""

from __future__ import annotations

from checkpoint_strategy.checkpoints.prune import load_policy, prune
from checkpoint_strategy.checkpoints.retention import Candidate, Retention, classify_name, plan_prune
from checkpoint_strategy.checkpoints.validate import validate_checkpoint, validate_paths

__all__ = ["validate_checkpoint", "validate_paths", "prune", "load_policy", "plan_prune", "Candidate", "Retention",
           "classify_name"]
