"""RecoveryOptions: every threshold and playbook number of `recover`, in one typed model.

Bounds live in the Field definitions, defaults in one place (the model), and the command-line
flags are mapped by the table FLAGS (field -> flag, what is expected), as planning/options.FIELDS
does for the plan. The API (`advise(**options)`), the CLI (`recover --z 6`), `detect_spikes`, the
online detector the callbacks feed and `on-event` all build the same model, so a bad value gives
the same one-line message everywhere and the rule labels in a report name the values in force.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.planning.planner import SPIKE_WAIT_STEPS

MAX_STEPS = 10**12


class RecoveryOptions(BaseModel):
    """Detection thresholds and the recovery playbook's numbers (sources in recovery/detect.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(
        128, ge=8, le=10**6, description="rolling window, in logged values (llm.c: 128)"
    )
    z_threshold: float = Field(
        7.0, ge=1.0, le=1e6, description="robust z of a spike (OLMo 2: 7 sigma)"
    )
    ratio_threshold: float = Field(
        2.5, ge=1.0, le=1e6, description="x rolling median (training-stability-monitor)"
    )
    max_ratio: float = Field(
        10.0, ge=1.0, le=1e6, description="x window max (Megatron-LM spiky loss)"
    )
    min_rise: float = Field(
        0.05, ge=0.0, le=100.0, description="minimum rise over the median for the z rule"
    )
    tolerance: float = Field(
        0.10,
        ge=0.0,
        le=100.0,
        description="'back near the healthy level' = within this fraction (the spec's 10%)",
    )
    wait_steps: int = Field(
        SPIKE_WAIT_STEPS, ge=0, le=MAX_STEPS, description="the spec's wait window, in steps"
    )
    min_wait_steps: int = Field(
        50, ge=0, le=MAX_STEPS, description="the spec's minimum wait, in steps"
    )
    margin: Optional[int] = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        description="resume at or before onset - margin (default: log interval + 1)",
    )
    lr_multiplier: float = Field(
        0.5, gt=0.0, le=1.0, description="LR factor after the resume (the spec: 50%)"
    )
    lr_reduced_steps: int = Field(
        500, ge=0, le=MAX_STEPS, description="steps at the reduced LR (the spec: 500)"
    )
    grad_clip: float = Field(
        0.5, gt=0.0, le=1e6, description="gradient clipping after the resume (the spec: 0.5)"
    )
    skip_past_onset: int = Field(20, ge=0, le=MAX_STEPS, description="skip batches up to onset + N")

    @model_validator(mode="after")
    def _waits(self) -> RecoveryOptions:
        if self.min_wait_steps > self.wait_steps:
            raise ValueError(
                f"min_wait_steps ({self.min_wait_steps}) must not exceed wait_steps ({self.wait_steps})"
            )
        return self


# field -> (flag, what is expected); the argparse definitions and every error message come from here
FLAGS: dict[str, tuple[str, str]] = {
    "window": ("--window", "a whole number of logged values, 8 to 1000000"),
    "z_threshold": ("--z", "a number from 1 to 10^6"),
    "ratio_threshold": ("--ratio", "a number from 1 to 10^6"),
    "max_ratio": ("--max-ratio", "a number from 1 to 10^6"),
    "min_rise": ("--min-rise", "a fraction from 0 to 100"),
    "tolerance": ("--tolerance", "a fraction from 0 to 100 (0.10 = 10%)"),
    "wait_steps": ("--wait", "a whole number of steps, 0 to 10^12"),
    "min_wait_steps": ("--min-wait", "a whole number of steps, 0 to 10^12, at most --wait"),
    "margin": ("--margin", "a whole number of steps, 0 to 10^12"),
    "lr_multiplier": ("--lr-multiplier", "a number > 0 and at most 1"),
    "lr_reduced_steps": ("--lr-steps", "a whole number of steps, 0 to 10^12"),
    "grad_clip": ("--grad-clip", "a number > 0 and at most 10^6"),
    "skip_past_onset": ("--skip-past-onset", "a whole number of steps, 0 to 10^12"),
}
DETECTION = ("window", "z_threshold", "ratio_threshold", "max_ratio", "min_rise", "tolerance")
PLAYBOOK = (
    "wait_steps",
    "min_wait_steps",
    "margin",
    "lr_multiplier",
    "lr_reduced_steps",
    "grad_clip",
    "skip_past_onset",
)
DEFAULTS = RecoveryOptions()


def build(options: Any = None, **values: Any) -> RecoveryOptions:
    """RecoveryOptions from a model, a mapping and/or keywords (None = default); UsageError naming the flag."""
    if isinstance(options, RecoveryOptions) and not values:
        return options
    data: dict[str, Any] = {}
    if isinstance(options, RecoveryOptions):
        data.update(options.model_dump())
    elif isinstance(options, dict):
        data.update(options)
    elif options is not None:
        raise UsageError(
            f"recovery options: expected RecoveryOptions or a mapping, got {type(options).__name__}"
        )
    data.update(values)
    data = {k: v for k, v in data.items() if v is not None or k == "margin"}
    unknown = sorted(set(data) - set(FLAGS))
    if unknown:
        raise UsageError(
            f"unknown recovery option {unknown[0]!r}; expected one of {', '.join(FLAGS)}"
        )
    for name, value in data.items():
        if isinstance(value, bool):
            raise UsageError(_bad(name, value))
        if FLAGS[name][1].startswith("a whole number") and isinstance(value, float):
            if not value.is_integer():
                raise UsageError(_bad(name, value))
            data[name] = int(value)
    try:
        return RecoveryOptions(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err.get("loc") or ()
        name = str(loc[0]) if loc else "min_wait_steps"
        if name not in FLAGS:
            name = "min_wait_steps"
        raise UsageError(_bad(name, data.get(name))) from None


def _bad(name: str, value: Any) -> str:
    flag, expected = FLAGS[name]
    return f"{flag}: expected {expected}, got {value!r}"


def from_args(args) -> RecoveryOptions:
    return build(None, **{name: getattr(args, name, None) for name in FLAGS})


def rule_labels(o: RecoveryOptions) -> dict[str, str]:
    """The names of the rules with the thresholds in force (reports print these)."""
    return {
        "z": f"z>={o.z_threshold:g} over rolling median/MAD (OLMo 2 7-sigma; llm.c z-score)",
        "ratio": f"loss >= {o.ratio_threshold:g}x rolling median (training-stability-monitor)",
        "max": f"loss >= {o.max_ratio:g}x window max (Megatron-LM spiky loss)",
        "nonfinite": "loss is NaN/inf (critical)",
        "grad": f"grad norm z>={o.z_threshold:g} and >= {o.ratio_threshold:g}x rolling median",
        "level": f"loss held above the healthy level + {o.tolerance:.0%} for >= {o.wait_steps} steps (level shift)",
        "collapse": "loss pinned at one value (collapse)",
        "start": f"loss ends more than {o.tolerance:.0%} above the loss the run started from",
    }
