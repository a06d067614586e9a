"""`checkpoint-strategy export --framework F [TOTAL_STEPS|--duration D STEP_SECONDS BUDGET_GB [plan options] |
--plan-file PLAN.json]
[--framework-version V] [--format text|json|python|toml|args]`."""

from __future__ import annotations

from checkpoint_strategy.cli.options import add_output
from checkpoint_strategy.cli.planoptions import (
    add_optional_run,
    add_plan_options,
    optional_run_numbers,
    plan_options_given,
)
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.export import FRAMEWORKS, OUTPUTS, export_plan, render_export
from checkpoint_strategy.export.common import load_plan_file
from checkpoint_strategy.planning.options import plan_arguments
from checkpoint_strategy.planning.planner import plan
from checkpoint_strategy.render import write_output

HELP = "the plan as a framework's own checkpoint settings (hf, lightning, orbax, torchtitan, megatron, deepspeed)"


def add_arguments(parser) -> None:
    parser.add_argument(
        "--framework",
        required=True,
        choices=list(FRAMEWORKS),
        help="the training framework whose settings to write",
    )
    parser.add_argument(
        "--framework-version",
        dest="framework_version",
        metavar="V",
        help="write for this version (default: the installed one, else the newest known)",
    )
    add_optional_run(parser)
    parser.add_argument(
        "--plan-file",
        dest="plan_file",
        metavar="PLAN.json",
        help="the JSON printed by `plan --format json` (instead of plan options); - reads stdin",
    )
    parser.add_argument(
        "--format",
        dest="format",
        choices=["text", "markdown", *OUTPUTS[1:]],
        default="text",
        help="text (default), markdown (the text report in a block), json (the report), python "
        "(hf, lightning, orbax, deepspeed), toml (torchtitan 0.1/0.2), args (torchtitan, megatron)",
    )
    add_output(parser)
    add_plan_options(parser, positionals=False)


def run(args) -> int:
    given = optional_run_numbers(args)
    options = plan_options_given(args)
    if args.plan_file is not None:
        if given or options:
            raise UsageError(
                "give either --plan-file or plan arguments (TOTAL_STEPS STEP_SECONDS BUDGET_GB ...), "
                "not both"
            )
        report = load_plan_file(args.plan_file)
    elif len(given) == 3:
        report = plan(plan_arguments(args))
    elif given:
        raise UsageError(
            "plan arguments need all three of TOTAL_STEPS (or --duration) STEP_SECONDS BUDGET_GB"
        )
    else:
        raise UsageError(
            "nothing to export: give TOTAL_STEPS STEP_SECONDS BUDGET_GB [plan options] "
            "or --plan-file PLAN.json"
        )

    export = export_plan(report, args.framework, args.framework_version)
    if args.format == "markdown":
        text = (
            f"### checkpoint-strategy export: {export.framework} {export.framework_version}\n\n```\n"
            + render_export(export, "text")
            + "```\n"
        )
    else:
        text = render_export(export, args.format)
    write_output(text, args.output)
    return 0
