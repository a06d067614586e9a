"""`checkpoint-strategy recover LOG [--checkpoints ROOT_OR_LIST] [--format text|markdown|json]`."""

from __future__ import annotations

from checkpoint_strategy.cli_options import MAX_STEPS, add_milestones, add_report_options, milestone_schedule, number
from checkpoint_strategy.recovery.options import add_log_options

HELP = "after a loss spike: which checkpoint to resume from"


def add_arguments(parser) -> None:
    add_log_options(parser)
    parser.add_argument("--checkpoints", metavar="ROOT_OR_LIST",
                        help="checkpoint folder (checkpoint-N, step-N, iter_0000500, global_stepN, "
                             "epoch=E-step=N.ckpt, numeric Orbax) or steps like 500,1000; default: next to the log")
    add_milestones(parser, paths=True, help="long-kept milestone checkpoints: a folder or steps like 1000,5000 "
                                            "(comma or space separated), or seed, pow2, none (the plan's schedules)")
    parser.add_argument("--grad-norm-column", "--grad-norm-key", dest="grad_norm_key", metavar="NAME",
                        help="grad-norm column/key/tag (optional; default: grad_norm, grad-norm, ...)")
    d = parser.add_argument_group("detection")
    d.add_argument("--window", type=number("window"), default=128, help="rolling window in logged values (default 128)")
    d.add_argument("--z", dest="z_threshold", type=number("threshold"), default=7.0, help="robust z threshold (default 7, OLMo 2)")
    d.add_argument("--ratio", dest="ratio_threshold", type=number("threshold"), default=2.5,
                   help="x rolling median that is a spike (default 2.5)")
    d.add_argument("--max-ratio", type=number("threshold"), default=10.0, help="x window max that is a spike (default 10, Megatron)")
    d.add_argument("--min-rise", type=number("relative"), default=0.05, help="minimum rise over the median for the z rule (0.05)")
    d.add_argument("--tolerance", type=number("relative"), default=0.10,
                   help="'near baseline' = within this fraction of the pre-spike level (default 0.10)")
    a = parser.add_argument_group("playbook")
    a.add_argument("--wait", dest="wait_steps", type=number("step_offset"), default=100, help="wait window, steps (default 100)")
    a.add_argument("--min-wait", dest="min_wait_steps", type=number("step_offset"), default=50, help="minimum wait, steps (default 50)")
    a.add_argument("--margin", type=number("step_offset"), default=None,
                   help="resume checkpoint at or before onset - MARGIN (default: log interval + 1)")
    a.add_argument("--lr-multiplier", type=number("multiplier"), default=0.5, help="default 0.5")
    a.add_argument("--lr-steps", dest="lr_reduced_steps", type=number("step_offset"), default=500, help="default 500")
    a.add_argument("--grad-clip", type=number("grad_clip"), default=0.5, help="default 0.5")
    a.add_argument("--skip-past-onset", type=number("step_offset"), default=20,
                   help="skip batches from the resume step to onset + N (default 20)")
    add_report_options(parser)


def run(args) -> int:
    from checkpoint_strategy.recovery.advice import advise
    from checkpoint_strategy.render import emit

    milestones = args.milestones  # a folder, or steps (a keyword names the plan's schedule)
    if isinstance(milestones, list) or milestones in ("seed", "pow2", "none"):
        milestones = milestone_schedule(milestones, MAX_STEPS) or None
    report = advise(args.log, args.checkpoints, milestones=milestones, log_format=args.log_format,
                    step_key=args.step_key, loss_key=args.loss_key, grad_norm_key=args.grad_norm_key,
                    lr_key=args.lr_key, run=args.run, window=args.window, z_threshold=args.z_threshold,
                    ratio_threshold=args.ratio_threshold, max_ratio=args.max_ratio, min_rise=args.min_rise,
                    tolerance=args.tolerance, wait_steps=args.wait_steps, min_wait_steps=args.min_wait_steps,
                    margin=args.margin, lr_multiplier=args.lr_multiplier, lr_reduced_steps=args.lr_reduced_steps,
                    grad_clip=args.grad_clip, skip_past_onset=args.skip_past_onset)
    emit(report, args.format, args.output)
    return 0
