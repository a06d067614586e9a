"""Do the fuzz tests reach the core? Each example reports `reached(True)` (the input was accepted and the core ran)
or `reached(False)` (rejected as bad input: exit 2 / UsageError). `@reaches_core()`, put above `@settings`/`@given`,
asserts after the last example that at most half were rejected (issue 18: a fuzzer whose examples all die in the
argument parser tests only the parser). A test that fuzzes bad input on purpose says so in its name and is not
decorated. Hypothesis statistics (`pytest --hypothesis-show-statistics`) show the same split as events, and
FUZZ_STATS=FILE appends one line per test: name, rejected, examples.
"""

from __future__ import annotations

import functools
import os
from collections import Counter

from hypothesis import event

_runs: list[Counter] = []


def reached(core: bool) -> bool:
    event("reached the core" if core else "rejected as bad input")
    if _runs:
        _runs[-1][core] += 1
    return core


def reaches_core(max_rejected: float = 0.5):
    def decorate(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            _runs.append(Counter())
            try:
                test(*args, **kwargs)
            finally:
                seen = _runs.pop()
            total = seen[True] + seen[False]
            if os.environ.get("FUZZ_STATS"):
                with open(os.environ["FUZZ_STATS"], "a", encoding="utf-8") as fh:
                    fh.write(f"{test.__name__} {seen[False]} {total}\n")
            assert total, f"{test.__name__}: no example called fuzzcheck.reached()"
            assert seen[False] <= max_rejected * total, (
                f"{test.__name__}: {seen[False]} of {total} examples rejected as bad input (at most "
                f"{max_rejected:.0%}): generate valid input and mutate it"
            )

        return run

    return decorate


# --------------------------------------------------------------------------- valid input, then mutated

from hypothesis import strategies as st  # noqa: E402

_pos = st.floats(0.01, 1e4, allow_nan=False).map(repr)
# Every plan option with values inside its documented range (vocabulary.BOUNDS), flags as one token.
PLAN_OPTIONS = st.one_of(
    st.tuples(st.just("--model_size_gb"), _pos),
    st.tuples(st.just("--params"), st.sampled_from(["7B", "350M", "1.3e9"])),
    st.tuples(st.just("--frequency"), st.integers(1, 10**5).map(str)),
    st.tuples(st.just("--keep-last"), st.integers(1, 60).map(str)),
    st.tuples(
        st.just("--milestones"), st.sampled_from(["seed", "pow2", "none", "1000,5000", "20000"])
    ),
    st.tuples(
        st.just("--formats"),
        st.sampled_from(["full_state_dict", "full_state_dict,safetensors", "sharded"]),
    ),
    st.tuples(st.just("--gpus"), st.integers(1, 20000).map(str)),
    st.tuples(st.just("--mtbf-hours"), st.floats(0.5, 1e5).map(repr)),
    st.tuples(st.just("--preset"), st.sampled_from(["conservative", "aggressive", "auto"])),
    st.tuples(st.just("--precision"), st.sampled_from(["fp32", "mixed", "mixed-no-master"])),
    st.tuples(st.just("--weights-dtype"), st.sampled_from(["fp32", "bf16", "fp16"])),
    st.tuples(st.just("--restart-seconds"), st.floats(0, 3600).map(repr)),
    st.tuples(st.just("--write-gbps"), st.floats(0.1, 100).map(repr)),
    st.tuples(st.just("--checkpoint-write-seconds"), st.floats(0.1, 3600).map(repr)),
    st.tuples(st.just("--max-loss-hours"), st.floats(0.1, 100).map(repr)),
    st.tuples(st.just("--gpus-per-node"), st.integers(1, 16).map(str)),
    st.tuples(st.just("--node-write-gbps"), st.floats(0.1, 50).map(repr)),
    st.tuples(st.just("--storage-gbps"), st.floats(1, 1000).map(repr)),
    st.tuples(st.just("--min-interval-seconds"), st.floats(0, 3600).map(repr)),
    st.tuples(st.just("--local-tier"), st.sampled_from(["100,2", "500,10", "2000,25"])),
    st.tuples(st.just("--node-loss-fraction"), st.floats(0.01, 1).map(repr)),
    st.sampled_from(
        [("--async",), ("--no-async",), ("--no-save-optimizer",), ("--save-optimizer",)]
    ),
)
# A plan's three positionals, real numbers in range: steps, seconds per step, budget in GB.
PLAN_POSITIONALS = st.tuples(
    st.integers(100, 10**7).map(str), st.floats(0.05, 100).map(repr), st.floats(1, 1e6).map(repr)
)
GARBAGE = st.one_of(
    st.sampled_from(["", "nan", "inf", "-1", "0", "1e308", "abc", "1,2,3", "--", "-x", "7Q"]),
    st.text(max_size=6),
    st.integers(-(10**16), 10**16).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
# How often a token is replaced by garbage: about one example in five (rolled per example: 16-19 of 0-19, the top of
# the range, since hypothesis draws small integers more often than uniform).
MUTATE = st.tuples(st.integers(0, 19), st.integers(0, 10**6), GARBAGE)


def flatten(pairs) -> list[str]:
    return [t for pair in pairs for t in pair]


def mutate(argv: list[str], roll) -> list[str]:
    """argv with one token (chosen by `roll`, a MUTATE draw) replaced by garbage one time in five."""
    chance, where, token = roll
    if chance < 16 or not argv:
        return argv
    out = list(argv)
    out[where % len(out)] = token
    return out


SIM_OPTIONS = st.one_of(
    PLAN_OPTIONS,
    st.tuples(st.just("--seed"), st.integers(0, 2**31).map(str)),
    st.tuples(st.just("--spike-rate"), st.floats(0, 3).map(repr)),
    st.tuples(st.just("--corrupt-prob"), st.floats(0, 0.5).map(repr)),
    st.tuples(st.just("--spike-wait-steps"), st.integers(1, 300).map(str)),
    st.tuples(st.just("--spike-margin-steps"), st.integers(0, 300).map(str)),
)


def _curve(args):
    import curves

    return curves.sample(*args)


# Real loss curves (tests/curves.py): healthy or troubled, 150-1200 logged values, 0.5-10 % noise, a few outliers.
LOSS_CURVES = st.tuples(
    st.integers(0, 2**32 - 1),
    st.sampled_from([None, None, "divergence", "level_shift", "slow_climb", "nan", "collapse"]),
    st.sampled_from([0.005, 0.02, 0.05, 0.10]),
    st.integers(150, 1200),
    st.integers(0, 3),
).map(_curve)


def assert_events_in_order(events) -> None:
    """Events (dicts or Spike models) come sorted by onset; the events of one detector are disjoint (each starts
    after the previous one came back). Across detectors they may overlap: a collapse or a slow climb (level-shift
    detector) can start inside a spike that came back, the never-trained rule (ends above where it started) can
    start with a NaN that came back, and grad-norm events are a series of their own."""

    def get(e, k):
        return e[k] if isinstance(e, dict) else getattr(e, k)

    def detector(e) -> str:
        if get(e, "kind") in ("collapse", "grad_norm"):
            return get(e, "kind")
        if any("the loss the run started from" in r for r in get(e, "detected_by")):
            return "start"  # the never-trained rule (detect._never_trained) judges the whole run, not a window
        return "shift" if any("(level shift)" in r for r in get(e, "detected_by")) else "spike"

    onsets = [get(e, "onset_step") for e in events if get(e, "kind") != "grad_norm"]
    assert onsets == sorted(onsets), onsets
    for family in {detector(e) for e in events}:
        same = [e for e in events if detector(e) == family]
        for a, b in zip(same, same[1:], strict=False):
            assert get(a, "onset_step") < get(b, "onset_step"), (a, b)
            if get(a, "recovered_step") is not None:
                assert get(a, "recovered_step") < get(b, "onset_step"), (a, b)
    for e in events:
        assert get(e, "onset_step") <= get(e, "peak_step")
        if get(e, "recovered_step") is not None:
            assert get(e, "recovered_step") > get(e, "onset_step")
