"""One option vocabulary for every command, below the command line: the bounds of each quantity, the
choices and their wording. The command line's side of it (argparse types, the shared option adders, the argv
normalisation) is `cli/options.py`.

- ``BOUNDS``: one table, quantity -> range and wording. Every numeric option of every command takes its
  argparse ``type`` from it (``cli.options.number("steps")``), and the plan model's ``Field`` bounds are the
  same numbers, so TOTAL_STEPS means the same range in plan, simulate and handoff.

Kept import-light: the ``plan`` command loads it on its start-up path.
"""

from __future__ import annotations

import math
from typing import Union


def shown(text: object, limit: int = 60) -> str:
    """A value echoed in an error message: repr, cut to `limit` characters."""
    r = repr(str(text))
    return r if len(r) <= limit else r[: limit - 4] + "...'"


def _fmt(n: float) -> str:
    if n == 2**63 - 1:
        return "2^63-1"
    if n == 2**53:
        return "2^53"
    if n >= 10**6 and math.log10(n).is_integer():
        return f"10^{int(math.log10(n))}"
    return f"{n:g}" if not float(n).is_integer() else str(int(n))


class Quantity:
    """A numeric quantity: ``what`` it is and its range (``lo_open``: strictly above ``lo``).
    (A plain class, not a dataclass: this module is on the plan command's start-up path.)"""

    __slots__ = ("what", "lo", "hi", "whole", "lo_open")

    def __init__(
        self, what: str, lo: float, hi: float, whole: bool = False, lo_open: bool = False
    ) -> None:
        self.what, self.lo, self.hi, self.whole, self.lo_open = what, lo, hi, whole, lo_open

    def __repr__(self) -> str:
        return f"Quantity({self.what!r}, {self.lo!r}, {self.hi!r}, whole={self.whole}, lo_open={self.lo_open})"

    def expected(self) -> str:
        low = f"> {_fmt(self.lo)}" if self.lo_open else f"from {_fmt(self.lo)}"
        high = f"at most {_fmt(self.hi)}" if self.lo_open else f"to {_fmt(self.hi)}"
        return f"{self.what}, {low} {'and ' if self.lo_open else ''}{high}"

    def contains(self, value: float) -> bool:
        low_ok = value > self.lo if self.lo_open else value >= self.lo
        return low_ok and value <= self.hi and (not self.whole or float(value).is_integer())


MAX_STEPS = 10**12
MAX_LIST = 200  # entries in a list option (--milestones steps, --sweep-*)

# One table: every bound on a number a user types. planning/models.py takes its Field bounds from here.
BOUNDS: dict[str, Quantity] = {
    "steps": Quantity("a whole number of steps", 1, MAX_STEPS, whole=True),
    "step_offset": Quantity("a whole number of steps", 0, MAX_STEPS, whole=True),
    # a step read from a training log or named in --checkpoints: any a float holds exactly (formats.steps.MAX_STEP)
    "logged_step": Quantity("a whole number of steps", 0, 2**53, whole=True),
    "step_seconds": Quantity("seconds per step", 0, 1e6, lo_open=True),
    "gb": Quantity("a size in GB", 0, 1e9, lo_open=True),
    "hours": Quantity("hours", 0, 1e9, lo_open=True),
    "seconds": Quantity("seconds", 0, 1e9),
    "gbps": Quantity("a write bandwidth in GB/s", 0, 1e6, lo_open=True),
    "params": Quantity("a parameter count", 1, 1e15),
    "gpus": Quantity("a whole number of GPUs", 1, 10**7, whole=True),
    "gpus_per_node": Quantity("a whole number of GPUs per node", 1, 1024, whole=True),
    "storage_gbps": Quantity("the storage's aggregate write rate in GB/s", 0, 1e7, lo_open=True),
    "fraction": Quantity("a fraction", 0, 1, lo_open=True),
    "keep": Quantity("a whole number of checkpoints", 1, 100000, whole=True),
    "runs": Quantity("a whole number of simulated runs", 1, 10**6, whole=True),
    "seed": Quantity("a whole number seed", 0, 2**63 - 1, whole=True),
    "spike_rate": Quantity("spikes per 1000 steps", 0, 1000),
    "probability": Quantity("a probability", 0, 0.5),
    "points": Quantity("a whole number of logged values", 1, 10**6, whole=True),
    "relative": Quantity("a relative change", 0, 100),
    "window": Quantity("a whole number of logged values", 8, 10**6, whole=True),
    "threshold": Quantity("a threshold", 1, 1e6),
    "multiplier": Quantity("a multiplier", 0, 1, lo_open=True),
    "grad_clip": Quantity("a gradient-norm clip", 0, 1e6, lo_open=True),
}


def field_bounds(quantity: str) -> dict:
    """pydantic Field keyword arguments (gt/ge, le) of one quantity: models share the table."""
    q = BOUNDS[quantity]
    lo = int(q.lo) if q.whole else q.lo
    hi = int(q.hi) if q.whole else q.hi
    return {"gt" if q.lo_open else "ge": lo, "le": hi}


# --- milestones -------------------------------------------------------------------------------

MILESTONE_KEYWORDS = ("seed", "pow2", "none")
MILESTONES_EXPECTED = (
    f"seed, pow2, none or at most {MAX_LIST} steps like 1000,5000 (comma or space separated)"
)
Milestones = Union[str, list[int]]


# --- shared option adders ---------------------------------------------------------------------

FORMATS = ("text", "markdown", "json")
POLICY_FORMATS = FORMATS + ("yaml",)


# --- argv normalisation -----------------------------------------------------------------------
