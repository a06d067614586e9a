"""`checkpoint-strategy prune ROOT [--keep-last N] [--milestones ...] [--policy FILE] [--apply]`."""

from __future__ import annotations

import sys

from checkpoint_strategy.errors import UsageError

HELP = "apply retention; delete only after a newer one validated"


def _milestones(text: str) -> list[int]:
    out = []
    for part in text.replace(",", " ").split():
        if not part.isdigit():
            raise UsageError(f"--milestones: {part!r} is not a step number; expected integers like 1000 5000")
        out.append(int(part))
    return out


def add_arguments(parser) -> None:
    parser.add_argument("root", metavar="ROOT", help="the folder that holds the checkpoints")
    parser.add_argument("--keep-last", type=int, default=None, metavar="N",
                        help="keep the N newest valid checkpoints (overrides the policy's keep_last)")
    parser.add_argument("--milestones", nargs="+", default=None, metavar="STEP",
                        help="steps never deleted (space or comma separated; overrides keep_milestone)")
    parser.add_argument("--policy", default=None, metavar="FILE",
                        help="the plan (YAML or JSON) or the handoff state file checkpoint-strategy.json, "
                             "detected by content: its keep_last and keep_milestone")
    parser.add_argument("--level", choices=("quick", "full", "deep"), default="quick",
                        help="validation level for the checkpoints that justify a deletion")
    parser.add_argument("--log", default=None, metavar="LOG",
                        help="training log checked for an unrecovered loss spike before deleting (default: the "
                             "newest valid checkpoint's trainer_state.json)")
    parser.add_argument("--no-spike-check", dest="spike_check", action="store_false",
                        help="do not read the training log (the spike's rollback checkpoint is then not protected)")
    parser.add_argument("--apply", action="store_true", help="delete (default: dry run, prints the plan)")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text", dest="fmt")


def run(args) -> int:
    from checkpoint_strategy.checkpoints.prune import prune
    from checkpoint_strategy.render import render_template, to_json

    milestones = None
    if args.milestones is not None:
        milestones = [m for text in args.milestones for m in _milestones(text)]
    report = prune(args.root, keep_last=args.keep_last, milestones=milestones, policy=args.policy,
                   apply=args.apply, level=args.level, log=args.log, spike_check=args.spike_check)
    if args.fmt == "json":
        sys.stdout.write(to_json(report.model_dump(mode="json")))
    else:
        name = "prune.md.j2" if args.fmt == "markdown" else "prune.txt.j2"
        sys.stdout.write(render_template(name, report=report.model_dump(mode="json")))
    return 1 if report.errors else 0
