"""Mutation score of the modules issue 18 names, with mutmut (pip install 'checkpoint-strategy[mutation]').

    python bench/mutation.py                       # every target, a seeded sample of 60 mutants each
    python bench/mutation.py planner --all         # one target, every mutant
    python bench/mutation.py detect --sample 100 --seed 3
    python bench/mutation.py planner --rerun old.json  # only the survivors of an earlier --json run

Not in CI: slow (planner.py alone is ~1200 mutants, ~8 min on one core). Each target mutates one module in a
scratch copy of the committed tree (git archive HEAD), with a fast, targeted test selection; mutmut runs for each
mutant only the selected tests that reach the mutated function. The copy moves scripts/checkpoint_strategy to
src/ (mutmut derives module names from src/ or the top folder). Prints the score and every survivor, marked
"text" when the mutant only changes a string literal (a message wording, not behaviour). docs/mutation.md
records the numbers and what each survivor is.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "src/checkpoint_strategy"
# the one test that inspects the planner's functions themselves (mutmut's trampolines replace them)
NOT_UNDER_MUTMUT = (
    "--deselect=tests/test_planning_storage.py::test_plan_function_is_split_into_short_steps"
)
# target -> (module files to mutate, tests that exercise them quickly: no real-run fixtures unless needed)
TARGETS = {
    "planner": (
        ["planning/planner.py"],
        [
            "tests/test_planning_planner.py",
            "tests/test_planning_failure.py",
            "tests/test_planning_storage.py",
            NOT_UNDER_MUTMUT,
        ],
    ),
    "planning-rest": (
        [
            "planning/failure.py",
            "planning/sizing.py",
            "planning/tiers.py",
            "planning/options.py",
            "cli/planoptions.py",
        ],
        [
            "tests/test_planning_planner.py",
            "tests/test_planning_failure.py",
            "tests/test_planning_tiers.py",
            "tests/test_planning_storage.py",
            "tests/test_planning_options.py",
            NOT_UNDER_MUTMUT,
            "--deselect=tests/test_planning_tiers.py::test_tier_functions_are_short_and_documented",
        ],
    ),
    "detect": (
        ["recovery/detect.py"],
        [
            "tests/test_recovery_detection.py",
            "tests/test_recovery_kinds.py",
            "tests/test_recovery_corpus.py",
            "tests/test_recovery_complete.py",
        ],
    ),
    # the real-run tests (HF, Lightning, log readers) are the ones that reach the eval-loss opinion, the
    # checkpoint list and the completed advice
    "advice": (
        ["recovery/advice.py"],
        [
            "tests/test_recovery_detection.py",
            "tests/test_recovery_kinds.py",
            "tests/test_recovery_inputs.py",
            "tests/test_recovery_realruns.py",
            "tests/test_recovery_logreaders.py",
            "tests/test_recovery_realrun.py",
            "tests/test_recovery_complete.py",
            "tests/test_recovery_corpus.py",
        ],
    ),
    # (the crash-safety test kills `prune --apply` subprocesses at random points, minutes a run: left out; the
    # other subprocesses run the mutated copy, see mutmut() below)
    "prune": (
        ["retention/prune.py"],
        [
            "tests/test_checkpoints_prune.py",
            "tests/test_checkpoints_prune_safety.py",
            "tests/test_checkpoints_prune_defaults.py",
            "--deselect=tests/test_checkpoints_prune.py::"
            "test_crash_safety_kill_prune_apply_at_random_points",
        ],
    ),
    # the keep rules' safety half (issue 40: what counts as an unresolved spike, what justifies a deletion)
    "safety": (
        ["retention/safety.py"],
        [
            "tests/test_checkpoints_prune.py",
            "tests/test_checkpoints_prune_safety.py",
            "tests/test_checkpoints_prune_best.py",
            "tests/test_checkpoints_prune_guards.py",
            "tests/test_checkpoints_prune_defaults.py",
            "tests/test_retention_safety.py",  # validate/release-gate/on-event's use of it, in-process
            "--deselect=tests/test_checkpoints_prune.py::"
            "test_crash_safety_kill_prune_apply_at_random_points",
        ],
    ),
    # (mutmut maps tests to functions in-process: a test that reaches a function only through a subprocess is
    # not run for its mutants; those subprocesses run the mutated copy all the same)
    "filechecks": (
        ["formats/filechecks.py"],
        [
            "tests/test_checkpoints_filechecks.py",
            "tests/test_checkpoints_deep.py",
            "tests/test_hardening_io.py",
            "tests/test_checkpoints_validate.py",
            # runs the launcher with `python -S`: the mutated copy imports mutmut's trampolines, not on that path
            "--deselect=tests/test_hardening_io.py::test_launcher_without_dependencies_names_them",
        ],
    ),
    "montecarlo": (
        ["simulation/montecarlo.py"],
        [
            "tests/test_simulation_montecarlo.py",
            "tests/test_simulation_exact.py",
            "tests/test_simulation_twotier.py",
            "tests/test_simulation_cli.py",
        ],
    ),
}
STATUS = (
    "killed",
    "survived",
    "no tests",
    "timeout",
    "suspicious",
    "skipped",
    "not checked",
    "segfault",
)


def scratch_copy(where: Path, files: list[str], tests: list[str]) -> Path:
    tree = where / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / "src").mkdir()
    shutil.move(str(tree / "scripts" / "checkpoint_strategy"), str(tree / PKG))
    py = (tree / "pyproject.toml").read_text()
    py = re.sub(r"^pythonpath = \[.*\]$", 'pythonpath = ["src", "tests"]', py, flags=re.M)
    py += (
        "\n[tool.mutmut]\n"
        + "\n".join(
            [
                f'source_paths = ["{PKG}/"]',
                "only_mutate = " + json.dumps([f"{PKG}/{f}" for f in files]),
                'also_copy = ["pyproject.toml", "tests", "templates", "schemas", "skill.yaml", "SKILL.md", "README.md", "docs",'
                ' "scripts"]',  # the launcher some tests run (the package moved to src/: found on PYTHONPATH)
                "pytest_add_cli_args_test_selection = " + json.dumps(tests),
                'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x"]',
            ]
        )
        + "\n"
    )
    (tree / "pyproject.toml").write_text(py)
    return tree


def mutmut(tree: Path, *args: str, check: bool = False) -> str:
    # the tests' subprocesses (tests/cliresult.py checkout_env) run the mutated copy, not the scratch tree's src/
    # and the real-run fixtures are built once, by the first test session, then copied (tests/conftest.py _built)
    env = {
        **os.environ,
        "CHECKPOINT_STRATEGY_TEST_SOURCE": str(tree / "mutants" / "src"),
        "CHECKPOINT_STRATEGY_FIXTURE_CACHE": str(tree.parent / "fixtures"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "mutmut", *args], cwd=tree, capture_output=True, text=True, env=env
    )
    if check and proc.returncode:
        raise SystemExit(
            f"mutmut {' '.join(args[:2])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def results(tree: Path) -> dict[str, str]:
    out = {}
    for line in mutmut(tree, "results", "--all", "true").splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name and status in STATUS:
            out[name] = status
    return out


def is_text_only(tree: Path, name: str) -> bool:
    diff = [
        ln
        for ln in mutmut(tree, "show", name).splitlines()
        if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
    ]
    strip = [re.sub(r'"[^"]*"|\'[^\']*\'', '""', ln[1:]) for ln in diff]
    return len(strip) == 2 and strip[0] == strip[1]


def run_target(
    name: str, sample: int | None, seed: int, children: int, names: list[str] | None = None
) -> dict:
    files, tests = TARGETS[name]
    with tempfile.TemporaryDirectory(prefix=f"mutation-{name}-") as tmp:
        tree = scratch_copy(Path(tmp), files, tests)
        chosen: list[str] = sorted(names or [])
        if sample is not None and not chosen:
            mutmut(
                tree, "run", "--max-children", str(children), "no-such-mutant*"
            )  # generate and map tests only
            every = sorted(results(tree))
            chosen = sorted(random.Random(seed).sample(every, min(sample, len(every))))
        mutmut(tree, "run", "--max-children", str(children), *chosen, check=True)
        found = results(tree)
        if chosen:
            found = {k: v for k, v in found.items() if k in chosen}
        survivors = {
            k: ("text" if is_text_only(tree, k) else "behaviour")
            for k, v in found.items()
            if v in ("survived", "no tests")
        }
        diffs = {k: mutmut(tree, "show", k) for k in survivors if survivors[k] == "behaviour"}
    counts = {
        s: sum(v == s for v in found.values())
        for s in STATUS
        if any(v == s for v in found.values())
    }
    tested = sum(counts.values()) - counts.get("not checked", 0) - counts.get("skipped", 0)
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    return {
        "target": name,
        "files": files,
        "tests": tests,
        "sampled": sample,
        "seed": seed,
        "mutants": len(found),
        "counts": counts,
        "score": round(killed / tested, 4) if tested else None,
        "survivors": survivors,
        "diffs": diffs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("targets", nargs="*", choices=[*TARGETS, []], help="default: all")
    ap.add_argument(
        "--sample", type=int, default=60, help="mutants per target, drawn with --seed (default 60)"
    )
    ap.add_argument("--all", action="store_true", help="every mutant of the target (no sample)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument(
        "--max-children", type=int, default=1, help="parallel mutants (the machine is shared)"
    )
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument(
        "--rerun", metavar="FILE", help="run only the survivors listed in an earlier --json FILE"
    )
    args = ap.parse_args()
    earlier = (
        {r["target"]: list(r["survivors"]) for r in json.loads(Path(args.rerun).read_text())}
        if args.rerun
        else {}
    )
    report = []
    for name in args.targets or list(earlier or TARGETS):
        r = run_target(
            name, None if args.all else args.sample, args.seed, args.max_children, earlier.get(name)
        )
        report.append(r)
        what = (
            "the survivors of " + args.rerun
            if args.rerun
            else "all"
            if r["sampled"] is None
            else f"sample of {r['sampled']} (seed {r['seed']})"
        )
        print(f"{name}: {r['mutants']} mutants ({what}), score {r['score']}, {r['counts']}")
        for k, why in sorted(r["survivors"].items()):
            print(f"  survived [{why}] {k}")
        sys.stdout.flush()
        if args.json:  # after each target: a later one that fails keeps the earlier results
            Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
