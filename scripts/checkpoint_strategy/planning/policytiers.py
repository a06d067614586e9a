"""The plan models' strict base and the two-tier policy (`checkpoint_policy.tiers`), in a module of their own:
formats/models.py (the policy file prune reads) names them without loading every plan model or the
planner."""

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class PolicyTier(_Strict):
    frequency: str = Field(description="every_N_steps")
    keep_last: int


class PolicyTiers(_Strict):
    local: PolicyTier
    persistent: PolicyTier
