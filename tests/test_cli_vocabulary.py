"""One vocabulary: walk every command's parser and check the shared options mean the same thing."""

from __future__ import annotations

import argparse

import pytest

from checkpoint_strategy.cli import main as cli
from checkpoint_strategy.cli import options as cli_opts
from checkpoint_strategy.cli.options import VOCABULARY, number
from checkpoint_strategy.vocabulary import BOUNDS, FORMATS, POLICY_FORMATS

# Formats beyond text/markdown/json/yaml: export writes code for the framework.
EXTRA_FORMATS = {"export": {"python", "toml", "args"}}
# Non-numeric argparse types that parse a list or a name (not a quantity of BOUNDS).
NAMED_TYPES = {
    "milestones",
    "formats_list",
    "params_count",
    "_require",
    "tier_spec",
    "path_arg",
    "byte_size",
    "steps_or_duration",
    "duration",
}

# recover's options are RecoveryOptions fields (bounds in Field); each matches one quantity of the table.
RECOVERY_QUANTITIES = {
    "window": "window",
    "z_threshold": "threshold",
    "ratio_threshold": "threshold",
    "max_ratio": "threshold",
    "min_rise": "relative",
    "tolerance": "relative",
    "wait_steps": "step_offset",
    "min_wait_steps": "step_offset",
    "margin": "step_offset",
    "lr_multiplier": "multiplier",
    "lr_reduced_steps": "step_offset",
    "grad_clip": "grad_clip",
    "skip_past_onset": "step_offset",
}

# The fewest arguments each command parses with (before any option under test).
MINIMAL = {
    "plan": ["100000", "2", "500"],
    "simulate": ["100000", "2", "500"],
    "tradeoffs": ["100000", "2", "500"],
    "recover": ["LOG"],
    "verify-resume": ["LOG", "--resume-step", "10"],
    "validate": ["CKPT"],
    "prune": ["ROOT"],
    "handoff": [],
    "release-gate": ["CKPT"],
    "on-event": ["EVENT"],
    "export": ["--framework", "hf"],
    "convert": ["SRC", "DST", "--to", "dcp"],
}


def parsers():
    for name in cli.COMMANDS:
        parser, _module = cli.build_parser(name)
        yield name, parser


def options(parser: argparse.ArgumentParser):
    return [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


def test_minimal_table_covers_every_command():
    assert set(MINIMAL) == set(cli.COMMANDS)


@pytest.mark.parametrize("name, parser", list(parsers()), ids=list(cli.COMMANDS))
def test_every_command_has_format_and_output(name, parser):
    by_flag = {s: a for a in options(parser) for s in a.option_strings}
    for flag in cli_opts.EVERY_COMMAND:
        assert flag in by_flag, f"{name} has no {flag}"
    fmt = by_flag["--format"]
    assert (
        set(FORMATS) <= set(fmt.choices) <= set(POLICY_FORMATS) | EXTRA_FORMATS.get(name, set())
    ), (name, fmt.choices)
    assert by_flag["-o"] is by_flag["--output"]


@pytest.mark.parametrize("name, parser", list(parsers()), ids=list(cli.COMMANDS))
def test_shared_options_follow_the_vocabulary(name, parser):
    for action in options(parser):
        for flag in action.option_strings:
            rule = VOCABULARY.get(flag)
            if rule is None:
                continue
            assert action.dest == rule["dest"], (name, flag)
            if "choices" in rule:
                assert tuple(action.choices) == rule["choices"], (name, flag)
            if "types" in rule:
                assert getattr(action.type, "__name__", "") in rule["types"], (
                    name,
                    flag,
                    action.type,
                )
            if "metavar" in rule:
                assert action.metavar == rule["metavar"], (name, flag)
            if "also" in rule:
                assert rule["also"] in action.option_strings, (name, flag)


@pytest.mark.parametrize("name, parser", list(parsers()), ids=list(cli.COMMANDS))
def test_every_typed_value_comes_from_the_bounds_table(name, parser):
    for action in [*options(parser), *[a for a in parser._actions if not a.option_strings]]:
        if action.type is None:
            continue
        assert action.type not in (int, float), (
            f"{name} {action.option_strings or action.dest}: raw {action.type}"
        )
        quantity = getattr(action.type, "quantity", None)
        kind = getattr(action.type, "__name__", "")
        model_checked = (
            action.dest in RECOVERY_QUANTITIES
        )  # converted, then checked by RecoveryOptions' Field
        assert quantity in BOUNDS or kind in NAMED_TYPES or model_checked, (
            name,
            action.option_strings or action.dest,
            kind,
        )


@pytest.mark.parametrize("name, parser", list(parsers()), ids=list(cli.COMMANDS))
def test_every_long_option_takes_both_spellings(name, parser):
    for action in options(parser):
        for flag in action.option_strings:
            if not flag.startswith("--") or "-" not in flag[2:] and "_" not in flag[2:]:
                continue
            for spelled in (
                flag.replace("-", "_").replace("__", "--", 1),
                "--" + flag[2:].replace("_", "-"),
            ):
                assert (
                    cli_opts.normalise_underscores(parser, [spelled])[0] in action.option_strings
                ), spelled
                assert (
                    cli_opts.normalise_underscores(parser, [spelled + "=1"])[0].split("=")[0]
                    in action.option_strings
                )


def test_underscored_option_parses_end_to_end():
    parser, _ = cli.build_parser("prune")
    ns = parser.parse_args(["ROOT", "--keep_last", "3", "--no_spike_check", "--format=json"])
    assert ns.keep_last == 3 and ns.spike_check is False and ns.format == "json"
    parser, _ = cli.build_parser("plan")
    ns = parser.parse_args(["10", "1", "1", "--model-size-gb", "2", "--gpu_mtbf_hours=100"])
    assert ns.model_size_gb == 2 and ns.gpu_mtbf_hours == 100


def test_a_value_that_looks_like_an_option_is_left_alone():
    parser, _ = cli.build_parser("recover")
    ns = parser.parse_args(["LOG", "--"])
    assert ns.log == "LOG"
    assert cli_opts.normalise_underscores(parser, ["--", "--keep_last"]) == ["--", "--keep_last"]


@pytest.mark.parametrize(
    "name", [n for n, p in parsers() if "--milestones" in p._option_string_actions]
)
@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize(
    "spelling", [["1000", "5000"], ["1000,5000"], ["1000,", "5000"], ["1000", "5_000"]]
)
def test_milestones_steps_comma_or_space_never_swallow_a_positional(name, where, spelling):
    parser, _ = cli.build_parser(name)
    plan_like = name in ("plan", "simulate", "tradeoffs", "handoff", "export")
    positional = (
        ["100000", "2", "500"]
        if plan_like
        else [a for a in MINIMAL[name] if not a.startswith("-")][:1]
    )
    required = ["--framework", "hf"] if name == "export" else []
    argv = (
        required + ["--milestones", *spelling] + positional
        if where == "before"
        else required + positional + ["--milestones", *spelling]
    )
    ns = parser.parse_args(argv)
    assert ns.milestones == [1000, 5000]
    dests = [a.dest for a in parser._actions if not a.option_strings]
    got = [getattr(ns, d) for d in dests if getattr(ns, d) is not None]
    assert [str(g).removesuffix(".0") for g in got] == positional


@pytest.mark.parametrize(
    ("name", "argv", "positional"),
    [
        (
            "plan",
            ["--keep-last", "3", "--milestones", "1000", "5000", "100000", "2", "500"],
            ["100000", "2", "500"],
        ),
        (
            "plan",
            ["--milestones", "1000", "5000", "100000", "--keep-last", "3", "2", "500"],
            ["100000", "2", "500"],
        ),
        ("plan", ["--milestones=1000", "5000", "100000", "2", "500"], ["100000", "2", "500"]),
        ("plan", ["100000", "--milestones", "1000", "5000", "2", "500"], ["100000", "2", "500"]),
        ("prune", ["--milestones", "1000", "5000", "--keep-last", "2", "ROOT"], ["ROOT"]),
        (
            "prune",
            ["--milestones", "1000", "5000", "1234"],
            ["1234"],
        ),  # a numeric folder name is still ROOT
        ("recover", ["--milestones", "1000", "5000", "--", "LOG"], ["LOG"]),
    ],
)
def test_milestones_steps_leave_the_positionals_their_words_wherever_the_options_are(
    name, argv, positional
):
    """One parse (cli.options.join_milestones): the steps after --milestones give the positionals the words they
    lack elsewhere in argv, options' values not counted as theirs."""
    parser, _ = cli.build_parser(name)
    ns = parser.parse_args(argv)
    assert ns.milestones == [1000, 5000]
    got = [getattr(ns, a.dest) for a in parser._actions if not a.option_strings]
    assert [str(g).removesuffix(".0") for g in got] == positional


@pytest.mark.parametrize(
    "name", [n for n, p in parsers() if "--milestones" in p._option_string_actions]
)
@pytest.mark.parametrize("keyword", ["seed", "pow2", "none", "SEED"])
def test_milestones_keywords_everywhere(name, keyword):
    parser, _ = cli.build_parser(name)
    ns = parser.parse_args([*(MINIMAL[name] or ["100000", "2", "500"]), "--milestones", keyword])
    assert ns.milestones == keyword.lower()


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", "1e13", "abc1", "1000,x"])
@pytest.mark.parametrize("name", ["plan", "prune", "handoff"])
def test_bad_milestones_are_one_usage_error(name, bad, cli_run):
    r = cli_run(name, *MINIMAL[name], "--milestones", bad)
    line = r.usage_error()
    assert "--milestones" in line and "seed, pow2, none or at most 200 steps" in line


def test_the_same_quantity_has_the_same_bound_everywhere(cli_run):
    too_many = str(BOUNDS["steps"].hi * 10)
    for argv in (
        ["plan", too_many, "1", "1"],
        ["simulate", too_many, "1", "1"],
        ["tradeoffs", too_many, "1", "1"],
        ["handoff", too_many, "1", "1", "--dry-run"],
    ):
        line = cli_run(*argv).usage_error()
        assert "TOTAL_STEPS" in line and BOUNDS["steps"].expected() in line, line
    for argv in (
        ["plan", "10", "1", "1", "--keep-last", "0"],
        ["prune", "ROOT", "--keep-last", "0"],
        ["tradeoffs", "10", "1", "1", "--sweep-keep-last", "0"],
    ):
        assert "from 1 to 100000" in cli_run(*argv).usage_error()


@pytest.mark.parametrize("quantity", sorted(BOUNDS))
def test_bounds_table_edges(quantity):
    q = BOUNDS[quantity]
    parse = number(quantity)
    hi = int(q.hi) if q.whole else q.hi
    assert parse(str(hi)) == hi
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        parse(str(q.hi * 2 + 1))
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        parse(str(q.lo) if q.lo_open else str(q.lo - 1))
    if not q.lo_open:
        assert parse(str(int(q.lo) if q.whole else q.lo)) == q.lo
    for junk in ("nan", "inf", "-inf", "", "1e999", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(junk)
    if q.whole:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(str(q.lo + 0.5))


@pytest.mark.parametrize(
    "word, suggestion",
    [
        ("valdate", "validate"),
        ("simulat", "simulate"),
        ("recovr", "recover"),
        ("prnue", "prune"),
        ("on_event", "on-event"),
    ],
)
def test_mistyped_command_suggests_the_closest(word, suggestion, cli_run):
    line = cli_run(word, "x").usage_error()
    assert (
        line
        == f"checkpoint-strategy: error: unknown command '{word}'; did you mean '{suggestion}'?"
    )


def test_unknown_word_lists_commands_and_numbers_still_plan(cli_run):
    line = cli_run("zzzzzz").usage_error()
    assert "unknown command 'zzzzzz'" in line and "validate" in line and "TOTAL_STEPS" in line
    assert cli_run("1e5", "2", "500", "--format", "json").json()["total_steps"] == 100000


def test_one_error_prefix_for_parser_and_core_errors(cli_run, tmp_path):
    parser_error = cli_run("simulate", "10", "1", "1", "--runs", "0").usage_error()
    core_error = cli_run("validate", str(tmp_path / "missing")).usage_error()
    for line in (parser_error, core_error):
        assert line.startswith("checkpoint-strategy: error: ") and line.count("error:") == 1, line


@pytest.mark.parametrize(
    "argv", [["plan", "1000", "1", "50"], ["simulate", "1000", "1", "50", "--runs", "50"]]
)
@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_output_file_gets_exactly_stdout(argv, fmt, cli_run, tmp_path):
    shown = cli_run(*argv, "--format", fmt)
    target = tmp_path / f"report.{fmt}"
    written = cli_run(*argv, "--format", fmt, "-o", str(target))
    assert shown.rc == written.rc == 0 and written.out == "" and target.read_text() == shown.out


def test_output_to_a_folder_or_missing_folder_is_one_usage_error(cli_run, tmp_path):
    assert (
        "is a folder" in cli_run("plan", "1000", "1", "50", "--output", str(tmp_path)).usage_error()
    )
    line = cli_run(
        "plan", "1000", "1", "50", "-o", str(tmp_path / "no" / "such" / "r.txt")
    ).usage_error()
    assert "cannot write" in line
    assert not (tmp_path / "no").exists()


PLAN_QUANTITIES = {
    "total_steps": "steps",
    "frequency": "steps",
    "step_seconds": "step_seconds",
    "budget_gb": "gb",
    "model_size_gb": "gb",
    "keep_last": "keep",
    "gpus": "gpus",
    "gpu_mtbf_hours": "hours",
    "mtbf_hours": "hours",
    "max_loss_hours": "hours",
    "checkpoint_write_seconds": "seconds",
    "restart_seconds": "seconds",
    "write_gbps": "gbps",
    "params": "params",
}


@pytest.mark.parametrize("field, quantity", sorted(PLAN_QUANTITIES.items()))
def test_plan_schema_bounds_are_the_table(field, quantity):
    from checkpoint_strategy.resources import load_schema

    prop = load_schema("arguments.schema.json")["properties"][field]
    prop = next(
        (p for p in prop.get("anyOf", [prop]) if p.get("type") in ("integer", "number")), prop
    )
    q = BOUNDS[quantity]
    assert prop["maximum"] == q.hi
    assert prop.get("exclusiveMinimum" if q.lo_open else "minimum") == q.lo, prop


def test_output_dash_is_stdout_and_empty_is_a_usage_error(cli_run):
    assert (
        cli_run("plan", "1000", "1", "50", "-o", "-").out == cli_run("plan", "1000", "1", "50").out
    )
    assert "empty path" in cli_run("plan", "1000", "1", "50", "-o", "").usage_error()


def test_too_many_milestones_is_one_short_usage_error(cli_run):
    steps = [str(10 * i) for i in range(1, 5000)]
    line = cli_run("prune", "--milestones", *steps, "ROOT").usage_error()
    assert "--milestones" in line and "at most 200 steps" in line and len(line) < 300, line


@pytest.fixture
def example_run(tmp_path, monkeypatch):
    from test_examples import build_inputs

    build_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_milestones_keywords_and_spaced_steps_work_in_prune_and_recover(example_run, cli_run):
    pow2 = cli_run(
        "prune", "run", "--keep-last", "1", "--milestones", "pow2", "--format", "json"
    ).json()
    assert pow2["milestones"] == [
        1000,
        2000,
    ]  # the plan's pow2 schedule up to the newest checkpoint (3000)
    spaced = cli_run(
        "prune", "--milestones", "1000", "2000", "run", "--keep-last", "1", "--format", "json"
    ).json()
    assert spaced["milestones"] == [1000, 2000]
    none = cli_run(
        "prune", "run", "--keep-last", "1", "--milestones", "none", "--format", "json"
    ).json()
    assert none["milestones"] == []
    rec = cli_run(
        "recover",
        "train.jsonl",
        "--checkpoints",
        "2500,3000",
        "--milestones",
        "1000",
        "2000",
        "--format",
        "json",
    ).json()
    assert (
        rec["resume_checkpoint"]["step"] == 2000 and rec["resume_checkpoint"]["kind"] == "milestone"
    )
    seed = cli_run(
        "recover",
        "train.jsonl",
        "--checkpoints",
        "2500,3000",
        "--milestones",
        "seed",
        "--format",
        "json",
    ).json()
    assert seed["resume_checkpoint"]["step"] == 1000  # seed: 1000, 5000, ...; 5000 is past the run


def test_policy_file_in_any_of_its_forms_for_prune_and_on_event(example_run, cli_run):
    plan = ["plan", "100000", "2.5", "500", "--keep-last", "1", "--milestones", "1000"]
    for fmt in ("yaml", "json"):
        cli_run(*plan, "--format", fmt, "-o", f"plan.{fmt}")
    cli_run("handoff", *plan[1:], "--state-dir", "state", "--format", "json")
    for policy in ("plan.yaml", "plan.json", "state/checkpoint-strategy.json"):
        report = cli_run("prune", "run", "--policy", policy, "--format", "json").json()
        assert report["keep_last"] == 1 and 1000 in report["milestones"], policy
        decision = cli_run("on-event", "events.json", "--policy", policy, "--format", "json").json()
        assert decision["policy_triggers"] == ["loss_spike_detected", "gradient_norm_exceeded"], (
            policy
        )
    (example_run / "bad.yaml").write_text("checkpoint_policy: [1, 2]\n")
    assert "bad.yaml" in cli_run("prune", "run", "--policy", "bad.yaml").usage_error()


def test_help_command_is_command_help(cli_run):
    assert cli_run("help", "validate").out == cli_run("validate", "--help").out
    assert "--manifest" in cli_run("help", "validate").out
    assert "did you mean 'prune'" in cli_run("help", "prnue").usage_error()
    assert "commands:" in cli_run("help").out


@pytest.mark.parametrize("field, quantity", sorted(RECOVERY_QUANTITIES.items()))
def test_recovery_option_bounds_are_the_table(field, quantity):
    from checkpoint_strategy.recovery.settings import RecoveryOptions

    meta = {type(m).__name__: m for m in RecoveryOptions.model_fields[field].metadata}
    q = BOUNDS[quantity]
    assert meta["Le"].le == q.hi
    low = meta["Gt"].gt if q.lo_open else meta["Ge"].ge
    assert low == q.lo and ("Gt" in meta) == q.lo_open


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_help_prints_and_exits_0(name, cli_run):
    """argparse formats help strings with %: a stray '%' in any option's help is an exit 3 here."""
    for argv in ([name, "--help"], ["help", name]):
        rc, out, err = cli_run(*argv)
        assert rc == 0 and err == "" and "usage:" in out, (argv, rc, err)


def test_a_step_too_large_names_the_real_bound(cli_run, tmp_path):
    """Issue 40: recover's step 10**16 was "expected a whole number >= 0", a bound it does not have. Every step a
    user gives recover and verify-resume, too large, names the bound from the table."""
    log = tmp_path / "train.jsonl"
    log.write_text("".join(f'{{"step": {s}, "loss": 1.0}}\n' for s in (10, 20, 10**16)))
    logged = BOUNDS["logged_step"].expected()
    assert logged == "a whole number of steps, from 0 to 2^53"
    line = cli_run("recover", log).usage_error()
    assert line.endswith(f"step at entry 3 is 1e+16; expected {logged}") and ">= 0" not in line, (
        line
    )
    log.write_text('{"step": 10, "loss": 1.0}\n{"step": 20, "loss": 1.0}\n')
    line = cli_run("recover", log, "--checkpoints", str(10**16)).usage_error()
    assert f"step {10**16} is too large" in line and line.endswith(
        "whole numbers of steps, from 0 to 2^53"
    ), line
    assert (
        "each step from 1 to 10^12"
        in cli_run("recover", log, "--milestones", str(10**16)).usage_error()
    )
    for option in ("--wait", "--lr-steps", "--min-wait"):
        line = cli_run("recover", log, option, str(10**16)).usage_error()
        assert "to 10^12" in line, line
    line = cli_run("verify-resume", log, "--resume-step", str(10**16)).usage_error()
    assert BOUNDS["step_offset"].expected() in line, line
