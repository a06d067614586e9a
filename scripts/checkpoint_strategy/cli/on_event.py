"""`checkpoint-strategy on-event EVENT_FILE|- [--policy FILE] [--log LOG] [--checkpoints DIR]`."""

from __future__ import annotations

import os

from checkpoint_strategy.cli.options import add_policy, add_report_options, path_arg
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.integrations.events import decide_all, event_stream, load_policy
from checkpoint_strategy.render import emit
from checkpoint_strategy.storage import read_text_input as read_text

HELP = "emergency-save decision for a stability event"


def add_arguments(parser) -> None:
    parser.add_argument(
        "event_file",
        metavar="EVENT_FILE",
        type=path_arg,
        help="training-stability-monitor events: one JSON event, a JSON list, JSON lines, "
        "or the monitor's text report; - reads stdin",
    )
    add_policy(
        parser, help="its emergency_save_on applies; default: both triggers, as the auto preset"
    )
    parser.add_argument(
        "--log",
        metavar="LOG",
        type=path_arg,
        help="the training log, filled into the recovery command",
    )
    parser.add_argument(
        "--checkpoints",
        metavar="DIR",
        type=path_arg,
        help="the checkpoint folder, filled into the recovery command",
    )
    add_report_options(parser)


def run(args) -> int:
    policy = None
    if args.policy:
        text, name = read_text(args.policy, "policy file")
        policy = load_policy(text, name)
    text, name = read_text(args.event_file, "event file")
    events, notes = event_stream(text, name)
    del text
    result = decide_all(
        events,
        policy,
        log=args.log,
        checkpoints=args.checkpoints,
        notes=notes,
        log_report=_log_report(args.log, args.checkpoints),
    )
    emit(
        result,
        args.format,
        args.output,
        inputs=(args.event_file, args.policy, args.log, args.checkpoints),
    )
    return 0


def _log_report(log, checkpoints):
    """recover's report on --log when it is a readable log (the same rules confirm the spike); None
    when there is no such file (the path is then only filled into the suggested command)."""
    if not log or not os.path.exists(log):
        return None
    from checkpoint_strategy.recovery import advise

    try:
        return advise(log, checkpoints if checkpoints and os.path.isdir(checkpoints) else None)
    except UsageError:
        return None
