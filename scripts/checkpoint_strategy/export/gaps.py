"""Policy items no framework holds natively, worded once (the modules add their own)."""

from __future__ import annotations

from checkpoint_strategy.export.common import CALLBACK_HF, CALLBACK_LIGHTNING, VALIDATE_API
from checkpoint_strategy.export.models import NotExpressible
from checkpoint_strategy.planning.models import PlanReport

CALLBACKS = {"hf": CALLBACK_HF, "lightning": CALLBACK_LIGHTNING}

# What converts each framework's sharded checkpoint into one full state dict.
FULL_STATE_DICT = {
    "torchtitan": "python -m torch.distributed.checkpoint.format_utils dcp_to_torch step-N OUT.pt",
    "megatron": "save with --ckpt-format torch_dist (re-shards on load) and convert with Megatron-LM "
    "tools/checkpoint/convert.py before changing parallelism",
    "deepspeed": "python zero_to_fp32.py CKPT_DIR OUT (DeepSpeed writes the script next to the checkpoint)",
    "orbax": "restore on the new mesh with a target sharding; Orbax has no single-file full state dict",
}


def common_gaps(report: PlanReport, framework: str) -> list[NotExpressible]:
    policy = report.policy
    callback = CALLBACKS.get(framework)
    out: list[NotExpressible] = []
    if policy.validate_on_save:
        out.append(
            NotExpressible(
                item="validate_on_save",
                reason="no framework checks a checkpoint after writing it",
                instead=(
                    f"add {callback}, which validates each save before the rolling window drops an older one"
                    if callback
                    else f"call {VALIDATE_API} after each save, or run "
                    "'checkpoint-strategy validate DIR' before anything is deleted"
                ),
            )
        )
    if policy.emergency_save_on:
        out.append(
            NotExpressible(
                item="emergency_save_on",
                reason=f"no native trigger for {', '.join(policy.emergency_save_on)}",
                instead=(
                    f"add {callback}, which saves on a loss spike or a gradient-norm excess"
                    if callback
                    else "send each stability event to 'checkpoint-strategy on-event' and save when it says so"
                ),
            )
        )
    return out


def format_gaps(
    report: PlanReport, framework: str, native_safetensors: bool = False
) -> list[NotExpressible]:
    formats = report.policy.save_formats
    out: list[NotExpressible] = []
    if "safetensors" in formats and not native_safetensors:
        out.append(
            NotExpressible(
                item="save_formats: safetensors",
                reason=f"{framework} checkpoints are not safetensors files",
                instead="export the weights at each milestone and at the end with safetensors.torch.save_file "
                "(or the framework's Hugging Face converter), from a validated checkpoint",
            )
        )
    if "full_state_dict" in formats and framework in FULL_STATE_DICT:
        out.append(
            NotExpressible(
                item="save_formats: full_state_dict",
                reason=f"{framework} saves shards tied to the parallel layout",
                instead=f"before moving hardware: {FULL_STATE_DICT[framework]}",
            )
        )
    return out
