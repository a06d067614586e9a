"""Benchmark: `validate --level quick` and a `prune` dry run on trees of HF-Trainer-shaped checkpoints
(9 files each: one safetensors file, its index, optimizer/scheduler/rng/args torch zip archives, three JSON
files), against an `os.walk` + `os.stat` of the same tree, at 500, 1000 and 2000 checkpoints (linear?).

Measured in process (the checks alone) and as the command (a fresh `python -m checkpoint_strategy`:
start-up included), by wall time and by CPU time (user + sys, forked children included; steadier on a shared
machine); the least of --repeat runs each. The command rows are also given against the walk run as a fresh
interpreter (`python -c WALK`): a command pays one interpreter start-up, and so does that floor. From 256 checkpoints the quick level splits the checks over forked
processes, one per usable core (validate/fanout.py): the rows "one process" turn that off; the wall time
is what the split saves, the CPU what it costs. Target (issue 30): at most 5x the walk at 2000 checkpoints, linear. After the table:
each row's cost per checkpoint (the CPU difference between the smallest and the largest tree over the walk's:
start-up excluded), and the start-up floors every command pays (the interpreter alone; importing pydantic and
jinja2; validate of 3 checkpoints) in walks of the largest tree; last, the quick check of one real AdamW
optimizer.pt (900 storages) against iterating its pickle's opcodes with pickletools.genops.

The command runs with its bytecode cached, as an installed package runs (pip writes the .pyc files): the
children get a PYTHONPYCACHEPREFIX in the temp folder and one unmeasured warm-up run, whatever
PYTHONDONTWRITEBYTECODE says (a checkout run with it set compiles every module on each start, ~0.1 s more).
A second, informational floor: opening and reading every file of the tree once (what any check that looks
inside the files pays at least); the ratios stay against the walk.

    python bench/bench_walk.py [--sizes 500,1000,2000] [--repeat 3] [--profile]

--profile: after the table, a cProfile of one in-process quick validation at the largest size (top 25 by
own time).

--instructions: instead of times, user-space instructions per checkpoint counted by valgrind (callgrind) in a
fresh interpreter with a fixed hash seed, (count at 300 checkpoints - count at 100) / 200 for each row: the
same figure whatever the load (kernel time is not counted, so the walk's share is understated), slow (about a
minute a run).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_recover import interleaved  # noqa: E402  (bench/ is on sys.path when run as a script)
from bench_recover import least as _least
from bench_validate import build_tree, stat_walk  # noqa: E402

from checkpoint_strategy.formats import archive as zr
from checkpoint_strategy.retention import prune
from checkpoint_strategy.validate import fanout, validate_paths  # noqa: E402


def read_walk(root: Path) -> int:
    """The floor of a check that looks inside files: open and read every file of the tree (first 64 KB) once."""
    n = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fstat(fd)
                os.read(fd, 1 << 16)
            finally:
                os.close(fd)
            n += 1
    return n


_WALK_CMD = (
    "import os, sys\n"
    "for d, _, names in os.walk(sys.argv[1]):\n"
    "    for n in names:\n"
    "        os.stat(os.path.join(d, n))\n"
)


def _walk_cmd(tree: Path) -> None:
    """The same walk run as a fresh interpreter (`python -c WALK TREE`): the floor of a command, which pays the
    interpreter's start-up that the in-process walk does not (the machine's site-packages .pth files included, as
    every command here pays them)."""
    subprocess.run([sys.executable, "-c", _WALK_CMD, str(tree)], check=True)


def _cli(argv: list[str], pycache: Path):
    """A call of a fresh `python -m checkpoint_strategy ARGV`, bytecode cached under `pycache` (the first call, a
    warm-up, writes it); bench_recover.least counts the child's CPU."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"), PYTHONPYCACHEPREFIX=str(pycache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run() -> None:
        proc = subprocess.run(
            [sys.executable, "-m", "checkpoint_strategy", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(
                f"{argv[0]} failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"
            )

    return run


def _tree(tmp: Path, n: int, distinct: bool) -> tuple[Path, int]:
    """The bench's tree of n checkpoints (distinct: every torch archive different) and its file count."""
    tree = tmp / f"tree{n}{'-distinct' if distinct else ''}"
    tree.mkdir()
    files = build_tree(tree, n, shards=1, distinct=distinct)
    stat_walk(tree)  # warm the dentry/inode cache for every measurement
    return tree, files


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="500,1000,2000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile one in-process quick validation at the largest size",
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="instructions per checkpoint under valgrind instead of times (load-independent; slow)",
    )
    args = ap.parse_args()
    if args.instructions:
        tmp = Path(tempfile.mkdtemp(prefix="bench-walk-"))
        try:
            print(
                "user-space instructions per checkpoint, (300 checkpoints - 100) / 200, callgrind, PYTHONHASHSEED=0"
            )
            instructions(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} (2-core machine shared with other jobs)")
    print(
        "ratios against an os.walk + os.stat of the same tree, least of "
        f"{args.repeat} interleaved rounds (every row and floor once a round); wall / CPU (user+sys)"
    )
    ok = True
    per_size: dict[int, dict[str, float]] = {}  # size -> row -> least CPU seconds (the walk's too)
    tmp = Path(tempfile.mkdtemp(prefix="bench-walk-"))
    try:
        floors = _startup_floors(tmp, args.repeat)
        for n in sizes:
            (tree, files), (distinct, _) = _tree(tmp, n, False), _tree(tmp, n, True)

            def quick(t=tree, n=n):
                r = validate_paths([str(t)], level="quick", progress=False)
                assert r.summary.valid == n, r.summary

            def dry(t=tree, n=n):
                r = prune(t, keep_last=1, spike_check=False)
                assert len(r.keep) + len(r.delete) == n and not r.applied, (
                    len(r.keep),
                    len(r.delete),
                )

            def one_process(fn):
                def run():
                    fanout.ENABLED = False
                    try:
                        fn()
                    finally:
                        fanout.ENABLED = True

                return run

            # every row (the floors too) measured in the same rounds, one call each, in turn: a machine that gets
            # slower or faster during the run moves the floor and the rows together (the least of the rounds each)
            fns = {
                "walk": lambda t=tree: stat_walk(t),
                "walk as a command": lambda t=tree: _walk_cmd(t),
                "floor": lambda t=tree: read_walk(t),
                "validate --level quick (in process)": quick,
                "  the same, one process": one_process(quick),
                "  the same, every archive different, one process": one_process(
                    partial(quick, distinct, n)
                ),
                "prune dry run (in process)": dry,
                "  the same, one process ": one_process(dry),
                "validate --level quick (command)": _cli(
                    ["validate", str(tree), "--level", "quick"], tmp / "pycache"
                ),
                "prune --keep-last 1 dry run (command)": _cli(
                    ["prune", str(tree), "--keep-last", "1", "--no-spike-check"], tmp / "pycache"
                ),
            }
            for fn in fns.values():  # warm-up: bytecode written, caches filled
                fn()
            got = dict(zip(fns, interleaved(list(fns.values()), args.repeat), strict=True))
            walk, walk_cmd, floor = got.pop("walk"), got.pop("walk as a command"), got.pop("floor")
            rows = list(got.items())
            print(
                f"{n} checkpoints, {files} files: walk {walk[0] * 1000:.0f} ms wall, {walk[1] * 1000:.0f} ms CPU; "
                f"floor (open + read every file) {floor[1] * 1000:.0f} ms CPU = {floor[1] / walk[1]:.1f}x"
            )
            print(
                f"  the walk as a command (a fresh interpreter): {walk_cmd[0] * 1000:.0f} ms wall, "
                f"{walk_cmd[1] * 1000:.0f} ms CPU (the floor of the command rows: their last column)"
            )
            per_size[n] = {"walk": walk[1], **{name: c for name, (_w, c) in rows}}
            for name, (w, c) in rows:
                line = (
                    f"  {name:40s} {w * 1000:6.0f} ms wall = {w / walk[0]:5.1f}x, {c * 1000:6.0f} ms CPU = "
                    f"{c / walk[1]:5.1f}x; {w / n * 1000:.2f} ms wall per checkpoint"
                )
                if "command" in name:
                    line += f"; against the walk as a command {w / walk_cmd[0]:.1f}x wall, {c / walk_cmd[1]:.1f}x CPU"
                print(line)
                if n == max(sizes):
                    # issue 30's target, 5x the walk: in process by wall (the split exists to use the cores), the
                    # command by wall against the walk as a command (both pay one interpreter start-up)
                    ok &= (
                        w / (walk_cmd[0] if "command" in name else walk[0]) <= 5.0
                        or "one process" in name
                    )
            if args.profile and n == max(sizes):
                _profile(quick)
            shutil.rmtree(tree)
            shutil.rmtree(distinct)
        _print_slopes(per_size, floors)
        _real_optimizer(tmp, args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0 if ok else 1


def _real_optimizer(tmp: Path, repeat: int) -> None:
    """The bench trees' archives are small and synthetic ({} pickles). A real Trainer checkpoint's optimizer.pt
    holds one storage per moment per parameter: the quick check of one (AdamW over 300 tensors, 900 storages,
    torch.save) against iterating its data.pkl's opcodes with pickletools.genops (what any opcode reader in
    Python pays at least). Needs torch; skipped without it."""
    try:
        import torch
    except ImportError:
        print("real optimizer.pt: torch not installed, skipped")
        return
    import io
    import pickletools
    import zipfile

    from checkpoint_strategy.formats import filechecks as fc

    params = [p for _ in range(150) for p in torch.nn.Linear(8, 8).parameters()]
    opt = torch.optim.AdamW(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    path = tmp / "optimizer.pt"
    torch.save(opt.state_dict(), path)
    with zipfile.ZipFile(path) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    ops = sum(1 for _ in pickletools.genops(pkl))
    floor = _least(lambda: sum(1 for _ in pickletools.genops(io.BytesIO(pkl))), repeat)
    ours = _least(lambda: fc.scan_zip(str(path), zr.Counter(), regular=True), repeat)
    print(
        f"real optimizer.pt ({path.stat().st_size >> 10} kB, data.pkl {len(pkl) >> 10} kB, {ops} opcodes): quick "
        f"check {ours[1] * 1000:.1f} ms CPU = {ours[1] / floor[1]:.2f}x iterating its opcodes with pickletools.genops "
        f"({floor[1] * 1000:.1f} ms)"
    )
    _real_tree(tmp, path, pkl, repeat)


REAL_TREE = 100


def _real_tree(tmp: Path, optimizer: Path, pkl: bytes, repeat: int) -> None:
    """What a tree of real checkpoints costs: the bench tree's checkpoints, each with that real optimizer.pt, checked
    at the quick level in one process, against the walk and against the least any check of their contents pays
    (every file opened and its first 64 kB read, and every torch archive's data.pkl iterated with genops)."""
    import io
    import pickletools

    tree = tmp / "real"
    tree.mkdir()
    build_tree(tree, REAL_TREE, shards=1)
    for ckpt in tree.iterdir():
        shutil.copyfile(optimizer, ckpt / "optimizer.pt")
    small = {}  # the synthetic archives' pickles, iterated as the real one is
    import zipfile

    for name in ("scheduler.pt", "rng_state.pth", "training_args.bin"):
        with zipfile.ZipFile(next(tree.iterdir()) / name) as z:
            small[name] = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))

    def floor() -> None:
        read_walk(tree)
        for _ in range(REAL_TREE):
            for data in (pkl, *small.values()):
                for _op in pickletools.genops(io.BytesIO(data)):
                    pass

    def quick(split: bool) -> None:
        fanout.ENABLED = split
        try:
            r = validate_paths([str(tree)], level="quick", progress=False)
        finally:
            fanout.ENABLED = True
        assert r.summary.valid == REAL_TREE, r.summary

    fns = [lambda: stat_walk(tree), floor, lambda: quick(False), lambda: quick(True)]
    for fn in fns:
        fn()
    walk, fl, one, split = interleaved(fns, repeat)
    print(
        f"{REAL_TREE} checkpoints with that optimizer.pt, quick, one process: {one[0] * 1000:.0f} ms wall, "
        f"{one[1] * 1000:.0f} ms CPU = {one[1] / walk[1]:.0f}x the walk ({walk[1] * 1000:.1f} ms), {one[1] / fl[1]:.2f}x "
        f"opening and reading every file and iterating every data.pkl with genops ({fl[1] * 1000:.0f} ms); split "
        f"(fewer than {fanout.MIN_ITEMS}, but slow: fanout.PROBE) {split[0] * 1000:.0f} ms wall = "
        f"{split[0] / one[0]:.2f}x one process, {split[1] * 1000:.0f} ms CPU"
    )


_PYDANTIC_FLOOR = (
    "import jinja2\n"
    "from pydantic import BaseModel, ConfigDict\n"
    "class M(BaseModel):\n"
    "    model_config = ConfigDict(extra='forbid')\n"
    "    a: int\n"
    "M(a=1).model_dump(mode='json')\n"
)


def _startup_floors(tmp: Path, repeat: int) -> dict[str, float]:
    """Least CPU seconds of what every command pays before its first checkpoint: the interpreter alone, the
    interpreter importing pydantic and jinja2 (the core's models and templates), the same defining and validating
    one model (pydantic loads most of itself there), and `validate` of a
    3-checkpoint tree (all of start-up, rendering included), bytecode cached as `_least_cli`'s."""
    env = dict(
        os.environ, PYTHONPATH=str(ROOT / "scripts"), PYTHONPYCACHEPREFIX=str(tmp / "pycache")
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    tree = tmp / "tree3"
    tree.mkdir()
    build_tree(tree, 3, shards=1)
    out = {}
    for name, argv in (
        ("python -c pass", ["-c", "pass"]),
        ("python -c 'import pydantic, jinja2'", ["-c", "import pydantic, jinja2"]),
        # pydantic loads most of itself at the first model class, and its validator and plug-in
        # loader at the first validation: what any command built on pydantic models pays
        ("  and one pydantic model, validated once", ["-c", _PYDANTIC_FLOOR]),
        (
            "validate of 3 checkpoints (command)",
            ["-m", "checkpoint_strategy", "validate", str(tree)],
        ),
    ):
        subprocess.run(
            [sys.executable, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        cpus = []
        for _ in range(max(3, repeat)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(
                [sys.executable, *argv],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        out[name] = min(cpus)
    shutil.rmtree(tree)
    return out


def _print_slopes(per_size: dict[int, dict[str, float]], floors: dict[str, float]) -> None:
    """Per checkpoint, start-up excluded: each row's CPU between the smallest and the largest tree over the walk's
    (the cost that grows with the tree), and what a command pays before its first checkpoint, in walks of the
    largest tree."""
    if len(per_size) < 2:
        return
    lo, hi = min(per_size), max(per_size)
    walk = per_size[hi]["walk"] - per_size[lo]["walk"]
    print(
        f"per checkpoint ({lo} -> {hi} checkpoints, CPU; start-up excluded), against the walk's "
        f"{walk / (hi - lo) * 1e6:.0f} us per checkpoint:"
    )
    for name in per_size[hi]:
        if name != "walk":
            d = per_size[hi][name] - per_size[lo][name]
            print(f"  {name:40s} {d / (hi - lo) * 1e6:6.0f} us = {d / walk:5.1f}x")
    print(
        f"start-up floors (CPU), in walks of {hi} checkpoints ({per_size[hi]['walk'] * 1000:.0f} ms):"
    )
    for name, c in floors.items():
        print(f"  {name:40s} {c * 1000:6.0f} ms = {c / per_size[hi]['walk']:5.1f}x")


_CHILD = """import sys
sys.path[:0] = [{scripts!r}, {bench!r}]
from bench_walk import read_walk, stat_walk, prune, validate_paths
what, tree = sys.argv[1], sys.argv[2]
if what == "quick":
    validate_paths([tree], level="quick", progress=False)
elif what == "prune":
    prune(tree, keep_last=1, spike_check=False)
else:
    (stat_walk if what == "walk" else read_walk)(tree)
"""


SIZES = (100, 300)


def instructions(tmp: Path) -> None:
    """Instructions per checkpoint of each row (callgrind, fresh interpreter each run): deterministic."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind")
    code = _CHILD.format(scripts=str(ROOT / "scripts"), bench=str(ROOT / "bench"))
    trees = {}
    # dict and set layouts (and so the counts) the same every run; one process: callgrind counts each forked child
    # on its own line, so a split at 300 checkpoints (fanout.MIN_ITEMS is 256) would count only part of the work
    env = dict(os.environ, PYTHONHASHSEED="0", CHECKPOINT_STRATEGY_PROCESSES="1")
    for n in SIZES:
        trees[n] = tmp / f"tree{n}"
        trees[n].mkdir()
        build_tree(trees[n], n, shards=1)
    per = {}
    for what in ("walk", "floor", "quick", "prune"):
        counts = []
        for n in SIZES:
            proc = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--callgrind-out-file=/dev/null",
                    sys.executable,
                    "-c",
                    code,
                    what,
                    str(trees[n]),
                ],
                capture_output=True,
                text=True,
                env=env,
            )
            found = [line.split()[-1] for line in proc.stderr.splitlines() if "Collected :" in line]
            if proc.returncode != 0 or not found:
                raise SystemExit(f"valgrind {what} failed: {proc.stderr.strip()[-300:]}")
            counts.append(int(found[-1]))
        per[what] = (counts[1] - counts[0]) / (SIZES[1] - SIZES[0])
    names = {
        "walk": "os.walk + os.stat",
        "floor": "open + read every file",
        "quick": "validate --level quick",
        "prune": "prune dry run",
    }
    for what, v in per.items():
        print(
            f"  {names[what]:28s} {v / 1e6:6.3f} M instructions per checkpoint = {v / per['walk']:5.1f}x the walk"
        )


def _profile(fn) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.runcall(fn)
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    sys.exit(main())
