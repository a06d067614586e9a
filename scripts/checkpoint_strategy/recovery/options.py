"""Argument helpers shared by `recover` and `verify-resume`."""

from __future__ import annotations

from checkpoint_strategy.storage import path_arg


def add_log_options(parser) -> None:
    parser.add_argument("log", metavar="LOG", type=path_arg,
                        help="trainer_state.json, CSV (W&B export too), JSON/JSON lines, TensorBoard events, "
                             "or a run/checkpoint folder (newest trainer_state.json)")
    g = parser.add_argument_group("log columns")
    g.add_argument("--log-format", default="auto", choices=("auto", "hf", "json", "jsonl", "csv", "tensorboard"),
                   help="default: from the file name and content")
    g.add_argument("--step-column", "--step-key", dest="step_key", metavar="NAME",
                   help="step column/key (default: step, global_step, _step, Step, ...)")
    g.add_argument("--loss-column", "--loss-key", "--tag", dest="loss_key", metavar="NAME",
                   help="loss column/key or TensorBoard scalar tag (default: loss, train/loss, lm loss, ...)")
    g.add_argument("--lr-column", "--lr-key", dest="lr_key", metavar="NAME", help="learning-rate column (optional)")
    g.add_argument("--run", metavar="NAME", help="W&B CSV export with several runs: which run")

