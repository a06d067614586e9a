"""The one shared fixture module: real checkpoints and logs, built once per test session.

Builders live in tests/realruns.py. Tests that change a checkpoint take a copy
(`copy_of`), so the session-wide originals stay pristine for every other test.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import pytest
import realruns  # tests/ is on the path by pyproject's [tool.pytest.ini_options] pythonpath
import resumeruns
from cliresult import Result, invoke
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
_STATE_BEFORE = pytest.StashKey[dict]()

# The fuzzers draw the same examples on every run, here and in CI (no random seed, no example database: a red run
# is a regression of the code, not a new draw, and a -n worker draws what a serial run draws).
# HYPOTHESIS_PROFILE=explore draws new examples each run (and keeps failing ones in .hypothesis/): a bug it finds
# becomes an @example on its fuzzer. `ci` is the default's old name (.ci/run set it).
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("ci", parent=settings.get_profile("deterministic"))
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "deterministic")

# The one place that says which tests are slow: every test that uses a real run (a model trained on
# CPU by the real framework, built once per session) and the few that are slow on their own.
# `pytest -m "not slow"` is the quick loop; CI runs everything.
REAL_RUN_FIXTURES = {
    "hf_run",
    "hf_run_self_recovering",
    "hf_resumes",
    "hf_run_restarted",
    "lightning_run",
    "dcp_checkpoint",
    "dcp_sharded",
    "safetensors_file",
    "loop_resumes",
    "lightning_resumes",
    "deepspeed_resumes",
    "hf_world_change",
    "deepspeed_zero2_run",
    "fsdp2_run",
    "torn_rank_run",
    "zero3_two_ranks",
}
# test function names that are slow without a real-run fixture (each over ~2 s; CI runs them all)
SLOW_TESTS: set[str] = {
    # callbacks/guard.py: real CPU training runs with a poisoned batch (3-6 s each)
    "test_a_poisoned_batch_is_rolled_back_and_the_run_ends_healthy",
    "test_recover_shows_the_rollbacks_done_and_judges_the_curve_after_the_last",
    "test_a_spike_that_recovers_within_the_window_is_not_rolled_back",
    "test_a_resume_that_drops_the_optimizer_state_stops_with_one_error",
    "test_a_slowed_save_in_a_real_trainer_lengthens_the_interval_once",
    # the quick loop was 72 s with 1901 tests (2026-12-03): its longest fuzzers and sweeps (1-2.7 s each) run in CI
    "test_fuzz_hostile_json_inputs_of_the_integrations",
    "test_fuzzed_csv_logs",
    "test_fuzzed_json_logs",
    "test_fuzzed_arguments",
    "test_fuzz_bad_csv_logs_exit_2_with_one_line",
    "test_plan_invariants",
    "test_documented_layouts_have_no_false_positives_at_deep",
    "test_fuzz_bad_json_logs_exit_2_with_one_line",
    "test_at_least_95_percent_of_spikes_found",
    "test_no_new_function_over_60_lines",
    "test_real_adamw_save_is_read",
    "test_quick_reads_only_headers_of_big_objects",
    "test_a_missing_bucket_names_the_bucket",
    "test_fuzz_bad_event_documents_exit_2_with_one_line",
    "test_fuzz_arguments_never_crash",
    "test_missing_bucket_and_empty_prefix_are_one_line",
    "test_fuzz_safetensors_headers",
    "test_detect_spikes_on_garbage_floats_never_crashes",
    "test_fuzz_arguments_never_internal_error",
    "test_two_handoff_commands_at_once",
    "test_fuzz_state_folder_contents",
    "test_fuzz_plan_storage_grows_with_keep_last",
    "test_fuzz_valid_plans_validate_against_schema",
    "test_fuzz_extreme_failure_models_exit_0_or_2",
    "test_zip_bomb_is_invalid_with_bounded_memory",
    "test_unreachable_endpoint_is_one_line_quickly_and_never_prints_secrets",
    "test_fuzz_on_event_never_crashes",
    "test_wheel_carries_templates_and_schemas",
    "test_fuzz_tradeoffs_never_internal_error",
    "test_lightning_top_k_named_by_the_trainer_state_is_kept",
    "test_full_to_dcp_and_back_through_torch_equal",
    "test_full_disk_exit_2_nothing_left",
    "test_fuzz_damaged_sources_convert_whole_or_not_at_all",
    "test_kill_9_mid_conversion_never_leaves_a_partial_destination",
    # the fast paths' hostile inputs: a 64 MB line, children parsing 200 000-deep nesting, torch.save archives
    "test_a_64_mb_line_and_nesting_past_the_recursion_limit",
    "test_nesting_that_crashed_old_orjson_is_a_clean_usage_error",
    "test_real_archives_read_the_same_from_memory",
    "test_damaged_archives_give_the_same_findings_from_memory",
    "test_readme_examples_run_as_written_in_a_fresh_copy_of_the_repo",  # ~12 subprocesses in a copy of the repo
    "test_hf_export_names_the_fsdp_state_dict_type_when_the_plan_is_sharded",  # imports transformers
    "test_sample_pickles_are_what_torch_load_reads",  # imports torch
    "test_a_document_with_text_after_it_is_invalid_json_not_empty",  # a 19 MB log, streamed
    "test_recover_without_checkpoints_loads_neither_the_validator_nor_prune",  # a fresh interpreter
    # the quick loop was 60-61 s with 1923 tests on the quiet machine (2026-12-03 12:27): its tests of 1.0-1.7 s
    "test_detect_spikes_never_crashes",
    "test_fuzz_bad_recover_arguments_exit_2_with_one_line",
    "test_plot_output_goes_through_the_same_writer",
    "test_console_script_module_and_launcher_agree",
    "test_hostile_policy_files",
    "test_zip64_record_past_a_sparse_file_end_allocates_nothing",
    "test_bad_policy_files",
    # real Lightning / HF runs (test_callbacks_runlayout.py)
    "test_lightning_default_logger_rerun_resumes_from_the_last_valid_checkpoint",
    "test_lightning_own_dirpath_says_nothing_about_versions",
    "test_hf_callback_writes_nothing_into_the_working_folder_by_default",
}
# real Orbax/JAX/DeepSpeed saves (the frameworks extra); numba kernels (loading numba is ~1.2 s, two subprocesses);
# real training runs in subprocesses (2-process torchrun / Lightning DDP; default logging)
SLOW_MODULES = {
    "test_export_frameworks",
    "test_checkpoints_kernels",
    "test_checkpoints_misreads",
    "test_convert_frameworks",
    "test_callbacks_multiproc",
    "test_callbacks_logging",
    "test_callbacks_best",
    "test_oracle_mutations",
    "test_oracle_zero_megatron",
    "test_callbacks_hf_playbook",
    "test_callbacks_preempt",
    "test_callbacks_lightning_playbook",
}


# `pytest -n auto` (pytest-xdist; README, .ci/run): every worker builds the session fixtures its tests use. The real
# runs that few tests use go to one worker each (pyproject's `--dist loadgroup`): each is built once, as in a serial
# run. The ones most tests use (hf_run: 400 tests) are built by both workers: one group would leave the other idle.
SHARED_REAL_RUNS = {"hf_run", "dcp_checkpoint", "lightning_run", "safetensors_file"}


@pytest.hookimpl(tryfirst=True)  # (before xdist's, which reads the xdist_group marks)
def _checkout_state() -> dict[str, tuple[int, int]]:
    """The files under the checkout's .claude/ (where handoff writes by default, `--state-dir .claude/state`, for the
    session-handoff skill of the project it runs in): size and mtime of each."""
    top = ROOT / ".claude"
    return {
        str(p.relative_to(ROOT)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in (top.rglob("*") if top.is_dir() else ())
        if p.is_file()
    }


def pytest_sessionstart(session):
    session.config.stash[_STATE_BEFORE] = _checkout_state()


def pytest_sessionfinish(session, exitstatus):
    """A test that wrote into the checkout (a command run with the repository as its working folder and its default
    output place, e.g. handoff without --state-dir) fails the run: tests write under their tmp_path only."""
    if hasattr(
        session.config, "workerinput"
    ):  # (an xdist worker: the controller looks once, after all)
        return
    before = session.config.stash.get(_STATE_BEFORE, None)
    after = _checkout_state()
    if before is not None and after != before:
        changed = sorted(set(after) ^ set(before) | {k for k in after if after[k] != before.get(k)})
        print(f"\ntests wrote into the checkout: {', '.join(changed)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = getattr(item, "originalname", item.name)
        module = item.module.__name__.rpartition(".")[2] if getattr(item, "module", None) else ""
        runs = REAL_RUN_FIXTURES & set(getattr(item, "fixturenames", ()))
        if runs or name in SLOW_TESTS or module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if runs - SHARED_REAL_RUNS:
            item.add_marker(pytest.mark.xdist_group(min(runs - SHARED_REAL_RUNS)))


@pytest.fixture
def cli_run(capsys, monkeypatch):
    """cli_run(*argv, stdin=None) -> Result(rc, out, err) with .json() and .usage_error()."""

    def _run(*argv, stdin: str | None = None) -> Result:
        return invoke(capsys, monkeypatch, argv, stdin)

    return _run


# bench/mutation.py sets CHECKPOINT_STRATEGY_FIXTURE_CACHE: mutmut starts a test session per mutant, and the real runs
# (built by the frameworks, none of the package's code involved) are then built once, in the first session, and
# copied into each later session's tmp folder (a private copy per session, as if built there).
FIXTURE_CACHE = os.environ.get("CHECKPOINT_STRATEGY_FIXTURE_CACHE")


def _rebase(value, old: str, new: str):
    if isinstance(value, Path):
        return Path(str(value).replace(old, new, 1)) if str(value).startswith(old) else value
    if isinstance(value, list):
        return [_rebase(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _rebase(v, old, new) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value,
            **{
                f.name: _rebase(getattr(value, f.name), old, new)
                for f in dataclasses.fields(value)
                if f.init
            },
        )
    return value


def _built(tmp_path_factory, name: str, build):
    """build(root) in a fresh tmp folder; with FIXTURE_CACHE, a copy of the first session's build."""
    root = tmp_path_factory.mktemp(name)
    if not FIXTURE_CACHE:
        return build(root)
    import pickle  # the test's own objects (paths and step lists), written by this function

    saved = (
        Path(FIXTURE_CACHE) / os.environ.get("PYTEST_XDIST_WORKER", "") / name
    )  # (a cache per -n worker)
    if not (saved / "result.pickle").exists():
        shutil.rmtree(saved, ignore_errors=True)
        (saved / "tree").mkdir(parents=True)
        result = build(saved / "tree")
        (saved / "result.pickle").write_bytes(pickle.dumps(result))
    result = pickle.loads((saved / "result.pickle").read_bytes())
    shutil.copytree(saved / "tree", root, symlinks=True, dirs_exist_ok=True)
    return _rebase(result, str(saved / "tree"), str(root))


@pytest.fixture(scope="session")
def skill_root() -> Path:
    """The skill folder (the repository root)."""
    return ROOT


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory) -> realruns.HFRun:
    """Tiny GPT-2 trained 200 steps by the real HF Trainer, checkpoint-N every 10 steps.

    The weights are perturbed at the end of step 120, so the logged loss jumps from about 1
    to about 10 at step 121 and has not recovered by step 200. checkpoint-120 is written
    *after* the perturbation: it already holds the spiked weights.
    """
    return _built(tmp_path_factory, "hf", realruns.build_hf_run)


@pytest.fixture(scope="session")
def hf_run_self_recovering(tmp_path_factory) -> realruns.HFRun:
    """The hf_run recipe with a smaller perturbation (spike_scale 1.5) at the end of step 120.

    Measured: the loss jumps from a pre-spike median of about 1.08 to about 4.5 at step 121 (about
    4x) and is back within 10 % by about step 139; no rollback needed. Checkpoints in
    output_dir/hf-run-self-recovering/checkpoint-N every 10 steps.
    """
    return _built(
        tmp_path_factory,
        "hf-selfrec",
        lambda root: realruns.build_hf_run(root, spike_scale=1.5, name="hf-run-self-recovering"),
    )


@pytest.fixture(scope="session")
def hf_resumes(tmp_path_factory) -> realruns.HFResumes:
    """A spike-free run crashed after step 110, resumed from checkpoint-100 by the real Trainer twice:
    `normal` (checkpoint as saved) and `no_optimizer` (optimizer.pt deleted: fresh AdamW and fresh
    LR schedule). Each log (JSON lines, one line per step) holds steps 1-110 then 101-130."""
    return _built(tmp_path_factory, "hf-resumes", realruns.build_hf_resumes)


@pytest.fixture(scope="session")
def hf_run_restarted(tmp_path_factory) -> realruns.HFRestartedRun:
    """A run that spiked at step 55 (weights blown up), crashed after logging step 60 and was resumed
    from checkpoint-50 to step 100, both attempts appending to one JSON lines log (51-60 twice)."""
    return _built(tmp_path_factory, "hf-restart", realruns.build_hf_restarted_run)


@pytest.fixture(scope="session")
def lightning_run(tmp_path_factory) -> realruns.LightningRun:
    """Real Lightning ModelCheckpoint files epoch=0-step=10/20/30.ckpt."""
    return _built(tmp_path_factory, "pl", realruns.build_lightning_run)


@pytest.fixture(scope="session")
def dcp_checkpoint(tmp_path_factory) -> Path:
    """A real torch.distributed.checkpoint folder step-100/ (.metadata + __0_0.distcp)."""
    return _built(tmp_path_factory, "dcp", realruns.build_dcp_checkpoint)


@pytest.fixture(scope="session")
def dcp_sharded(tmp_path_factory) -> Path:
    """A real torch.distributed.checkpoint folder step-100/ with 4 data files (__0_0..__0_3.distcp)."""
    return _built(tmp_path_factory, "dcp-sharded", realruns.build_dcp_sharded)


@pytest.fixture(scope="session")
def safetensors_file(tmp_path_factory) -> Path:
    """A real model.safetensors written by safetensors.torch.save_file."""
    return realruns.build_safetensors_file(tmp_path_factory.mktemp("st"))


@pytest.fixture
def copy_of(tmp_path):
    """copy_of(path) -> a private copy (file or folder) under this test's tmp_path."""

    def _copy(path: Path, name: str | None = None) -> Path:
        dest = tmp_path / (name or Path(path).name)
        if Path(path).is_dir():
            shutil.copytree(path, dest, symlinks=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        return dest

    return _copy


@pytest.fixture(scope="session")
def torchtitan_layout(tmp_path_factory) -> Path:
    """torchtitan's checkpoint/ folder via plain DCP with its key names: step-10 full, step-20 model-only."""
    return realruns.build_torchtitan_layout(tmp_path_factory.mktemp("tt"))


@pytest.fixture(scope="session")
def deepspeed_run(tmp_path_factory) -> Path:
    """A real DeepSpeed ZeRO-1 CPU save (global_step3/, global_step6/, latest); needs the frameworks extra."""
    pytest.importorskip(
        "deepspeed",
        reason="DeepSpeed is in the frameworks extra: pip install --no-build-isolation "
        "deepspeed (or pip install -e '.[test,frameworks]')",
    )
    return realruns.build_deepspeed_run(tmp_path_factory.mktemp("ds"))


@pytest.fixture(scope="session")
def loop_resumes(tmp_path_factory) -> resumeruns.Resumes:
    """A plain torch loop's DCP step-10 (train_state.step an int), resumed to step-20 `intact` and `reset`
    (weights loaded, a new AdamW)."""
    return _built(tmp_path_factory, "loop-resumes", resumeruns.build_loop_resumes)


@pytest.fixture(scope="session")
def lightning_resumes(tmp_path_factory) -> resumeruns.Resumes:
    """Lightning step=10 resumed by fit(ckpt_path=...) to step=20, `intact` and `reset` (optimizer state cleared)."""
    return _built(tmp_path_factory, "pl-resumes", resumeruns.build_lightning_resumes)


@pytest.fixture(scope="session")
def deepspeed_resumes(tmp_path_factory) -> resumeruns.Resumes:
    """DeepSpeed ZeRO-1 global_step3 resumed to global_step6 with load_optimizer_states True (`intact`) / False."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the frameworks extra")
    return _built(tmp_path_factory, "ds-resumes", resumeruns.build_deepspeed_resumes)


@pytest.fixture(scope="session")
def hf_world_change(tmp_path_factory) -> Path:
    """HF Trainer under torchrun, 2 gloo processes to checkpoint-4, resumed by 1 process to checkpoint-6."""
    return _built(tmp_path_factory, "hf-world", resumeruns.build_hf_world_change)


@pytest.fixture(scope="session")
def deepspeed_zero2_run(tmp_path_factory) -> Path:
    """A real DeepSpeed ZeRO-2 CPU save (global_step3/, global_step6/, latest) plus DeepSpeed's ds_to_universal
    conversion of global_step6 (global_step6_universal/, latest_universal); needs the frameworks extra."""
    pytest.importorskip(
        "deepspeed",
        reason="DeepSpeed is in the frameworks extra: pip install --no-build-isolation "
        "deepspeed (or pip install -e '.[test,frameworks]')",
    )
    folder = realruns.build_deepspeed_run(tmp_path_factory.mktemp("ds2"), stage=2)
    realruns.build_deepspeed_universal(folder)
    return folder


@pytest.fixture(scope="session")
def torn_rank_run(tmp_path_factory) -> Path:
    """The output folder of a real 2-process torchrun HF Trainer run (gloo) with rank 1 killed mid-save of
    checkpoint-15: checkpoint-5 and checkpoint-10 hold rng_state_0/1.pth, checkpoint-15 lacks rng_state_1.pth."""

    def build(root: Path) -> Path:
        from test_callbacks_multiproc import launch

        res = launch(
            "hf",
            root / "out",
            root / "work",
            timeout=300,
            callback=False,
            kill_step=15,
            kill_after_state=True,
            save_every=5,
            max_steps=20,
        )
        assert res.returncode != 0, "rank 1 was to be killed"
        return root / "out"

    return _built(tmp_path_factory, "torn-rank", build)


@pytest.fixture(scope="session")
def fsdp2_run(tmp_path_factory) -> Path:
    """A plain loop's FSDP2 (2 CPU processes, gloo) DCP saves in step-2/ and step-4/."""
    return realruns.build_fsdp2_run(tmp_path_factory.mktemp("fsdp2"))


@pytest.fixture(scope="session")
def orbax_killed_save(tmp_path_factory) -> Path:
    """An Orbax folder with a finished 1/ and the 2.orbax-checkpoint-tmp/ of a save killed mid-write."""
    pytest.importorskip(
        "orbax.checkpoint",
        reason="Orbax is in the frameworks extra: pip install orbax-checkpoint "
        "'jax[cpu]' (or pip install -e '.[test,frameworks]')",
    )
    return realruns.build_orbax_killed_save(tmp_path_factory.mktemp("orbax-kill"))


@pytest.fixture(scope="session")
def moto_server():
    """moto's S3 server (ThreadedMotoServer) on 127.0.0.1 and a free port, every request counted
    (tests/objectstore.py); stopped at the end of the session."""
    pytest.importorskip("s3fs", reason="object storage needs s3fs: pip install -e '.[test]'")
    pytest.importorskip("moto", reason="the S3 tests need moto[server]: pip install -e '.[test]'")
    import objectstore

    server = objectstore.start(env={})
    yield server
    server.stop()


@pytest.fixture
def s3(moto_server, monkeypatch, request):
    """A fresh bucket on the moto server; AWS_ENDPOINT_URL and dummy credentials in the environment.
    ``s3.url`` is s3://BUCKET, ``s3.fs`` an s3fs client for setting up objects, ``s3.server`` counts."""
    import re

    import objectstore

    for key, value in objectstore.CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(key, raising=False)
    bucket = (
        re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
        + f"-{id(request) % 10**6}"
    )
    fs = objectstore.s3fs_client(moto_server.endpoint)
    fs.mkdir(bucket)
    moto_server.reset()

    class S3:
        url = f"s3://{bucket}"
        name = bucket
        server = moto_server

    S3.fs = fs
    return S3


@pytest.fixture(autouse=True)
def _no_internal_error(monkeypatch):
    """No command may exit 3 anywhere in the suite: an "internal error" printed by an in-process
    `cli.main` fails the test that caused it (at teardown), whatever exit code the test expected."""
    from checkpoint_strategy.cli import main as cli

    seen: list[str] = []
    real = cli._err

    def spy(message: str) -> None:
        if message.startswith("internal error"):
            seen.append(message)
        real(message)

    monkeypatch.setattr(cli, "_err", spy)
    yield
    assert not seen, f"a command exited 3 (internal error): {seen[0]}"
