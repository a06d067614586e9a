"""Hypothesis fuzzers for issue 9's reading layer: nested JSON, huge integers, hostile names and
special files, thrown at real checkpoints (copied) and at every JSON input of the integrations.

The property everywhere: exit 0, 1 or 2 (never 3: conftest fails the test on an internal error),
exit 2 prints exactly one stderr line, nothing hangs, and a name never adds a line to the output.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import tempfile
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_strategy.cli.main import main

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --------------------------------------------------------------------------- strategies


def _deep(n: int, kind: str) -> str:
    if kind == "list":
        return "[" * n + "]" * n
    if kind == "object":
        return '{"a":' * n + "1" + "}" * n
    return "[" * n  # unterminated


#: JSON text nested from harmless to far past the recursion limit
nested_json = st.builds(
    _deep,
    st.one_of(st.integers(1, 50), st.integers(900, 1200), st.integers(100_000, 200_000)),
    st.sampled_from(["list", "object", "open"]),
)
#: integers far past float range, up to past Python's 4300-digit parsing limit
huge_ints = st.builds(
    lambda digits, sign: sign + "9" * digits, st.integers(300, 6000), st.sampled_from(["", "-"])
)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**30), 10**30),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_leaf,
    lambda c: st.one_of(
        st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c, max_size=4)
    ),
    max_leaves=20,
)


def _dump(v) -> str:
    return json.dumps(v)  # NaN/Infinity tokens included: readers must cope


json_documents = st.one_of(
    nested_json,
    huge_ints,
    huge_ints.map(lambda i: '{"event": "LOSS_SPIKE", "step": ' + i + ', "global_step": ' + i + "}"),
    json_values.map(_dump),
    st.text(max_size=60),
)
HOSTILE_PIECES = [
    "\n",
    "\r",
    "|",
    "`",
    "<!--",
    "-->",
    "\u2028",
    "\x00",
    " ",
    "- **x**",
    "#",
    "'",
    '"',
    "$(",
    "\\",
]
hostile_names = (
    st.lists(
        st.one_of(st.sampled_from(HOSTILE_PIECES), st.text("abc-_.", min_size=1, max_size=3)),
        min_size=1,
        max_size=6,
    )
    .map("".join)
    .filter(lambda s: "\x00" not in s and "/" not in s and s not in (".", ".."))
)
special_kinds = st.sampled_from(
    ["fifo", "socket", "dev_zero", "dev_null", "folder", "dangling", "loop", "empty"]
)


# --------------------------------------------------------------------------- helpers


def _run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(a) for a in argv])
    if rc == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    assert rc in (0, 1, 2), err.getvalue()
    return rc, out.getvalue(), err.getvalue()


class Hang(Exception):
    pass


@contextmanager
def no_hang(seconds: int = 30):
    def boom(_sig, _frame):
        raise Hang(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _make_special(path: Path, kind: str, keep: list) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        short = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp")) / "s"
        s.bind(str(short))
        keep.append((s, short))
        path.symlink_to(short)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "dev_null":
        path.symlink_to("/dev/null")
    elif kind == "folder":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(path.parent / "no-such-file")
    elif kind == "loop":
        path.symlink_to(path.name)
    else:
        path.write_bytes(b"")


# --------------------------------------------------------------------------- fuzzers

CHECKPOINT_JSON = [
    "trainer_state.json",
    "config.json",
    "generation_config.json",
    "integrity.json",
    "model.safetensors",
]


@FUZZ
@given(
    doc=json_documents,
    name=st.sampled_from(CHECKPOINT_JSON),
    level=st.sampled_from(["quick", "full"]),
)
def test_fuzz_hostile_json_inside_a_real_checkpoint(hf_run, tmp_path, doc, name, level):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        ck = Path(d) / "checkpoint-50"
        shutil.copytree(hf_run.output_dir / "checkpoint-50", ck)
        raw = doc.encode("utf-8", "surrogatepass")
        if name == "model.safetensors":
            raw = len(raw).to_bytes(8, "little") + raw
        (ck / name).write_bytes(raw)
        extra = ["--manifest", "verify"] if name == "integrity.json" else []
        rc, out, _err = _run(["validate", ck, "--level", level, "--format", "json", *extra])
        assert rc in (0, 1)
        if name in ("trainer_state.json", "config.json", "model.safetensors") and doc.startswith(
            "[" * 5000
        ):
            assert rc == 1  # far too deep: reported, never "valid"


@FUZZ
@given(
    doc=json_documents,
    where=st.sampled_from(["event", "policy", "plan", "agent-state", "prune-policy"]),
)
def test_fuzz_hostile_json_inputs_of_the_integrations(tmp_path, doc, where):
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        p = Path(d) / "input.json"
        p.write_text(doc, encoding="utf-8", errors="surrogatepass")
        st_dir = Path(d) / "state"
        if where == "event":
            argv = ["on-event", p]
        elif where == "policy":
            ev = Path(d) / "ev.json"
            ev.write_text('{"event": "LOSS_SPIKE", "step": 5}')
            argv = ["on-event", ev, "--policy", p]
        elif where == "plan":
            argv = ["handoff", "--plan-file", p, "--state-dir", st_dir]
        elif where == "agent-state":
            st_dir.mkdir()
            (st_dir / "agent-state.json").write_bytes(p.read_bytes())
            argv = ["handoff", "100000", "2", "500", "--state-dir", st_dir]
        else:
            root = Path(d) / "root"
            root.mkdir()
            argv = ["prune", root, "--policy", p]
        before = {q.name: q.read_bytes() for q in st_dir.iterdir()} if st_dir.exists() else {}
        rc, _out, _err = _run(argv)
        if rc == 2 and st_dir.exists():  # bad input: the state folder is as it was
            after = {
                q.name: q.read_bytes()
                for q in st_dir.iterdir()
                if q.name != ".checkpoint-strategy.lock"
            }
            assert after == before


@FUZZ
@given(name=hostile_names, fmt=st.sampled_from(["text", "markdown"]))
def test_fuzz_hostile_names_never_add_a_line(hf_run, tmp_path, name, fmt):
    """The same run under a benign and a hostile folder name prints the same number of lines."""
    counts = []
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        for root in (Path(d) / "benign", Path(d) / name):
            root.mkdir()
            shutil.copytree(hf_run.output_dir / "checkpoint-40", root / "checkpoint-40")
            shutil.copytree(hf_run.output_dir / "checkpoint-50", root / "checkpoint-50")
            lines = []
            for argv in (
                ["validate", root, "--format", fmt],
                ["prune", root, "--keep-last", "1", "--format", fmt],
                ["release-gate", root / "checkpoint-50", "--format", fmt],
            ):
                rc, out, err = _run(argv)
                assert rc in (0, 1), err
                lines.append(len(out.splitlines()))
            counts.append(lines)
    assert counts[0] == counts[1]


HF_FILES = [
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
    "training_args.bin",
    "trainer_state.json",
    "config.json",
    "generation_config.json",
]


@FUZZ
@given(
    name=st.sampled_from(HF_FILES),
    kind=special_kinds,
    level=st.sampled_from(["quick", "full"]),
    command=st.sampled_from(["validate", "release-gate", "prune", "handoff"]),
)
def test_fuzz_special_files_never_hang_and_never_pass(hf_run, tmp_path, name, kind, level, command):
    keep: list = []
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        root = Path(d) / "run"
        root.mkdir()
        shutil.copytree(hf_run.output_dir / "checkpoint-40", root / "checkpoint-40")
        ck = root / "checkpoint-50"
        shutil.copytree(hf_run.output_dir / "checkpoint-50", ck)
        try:
            _make_special(ck / name, kind, keep)
            with no_hang():
                if command == "validate":
                    rc, out, _ = _run(["validate", ck, "--level", level, "--format", "json"])
                    assert rc == 1 and json.loads(out)["checkpoints"][0]["status"] != "valid"
                elif command == "release-gate":
                    rc, _out, _ = _run(["release-gate", ck, "--level", level])
                    assert rc in (1, 2)
                elif command == "prune":
                    rc, _out, _ = _run(
                        ["prune", root, "--keep-last", "1", "--level", level, "--apply"]
                    )
                    assert ck.exists() or ck.is_symlink()  # not whole: never deleted
                    assert (root / "checkpoint-40").exists()  # the only whole one: kept
                else:
                    rc, out, _ = _run(
                        [
                            "handoff",
                            "--checkpoints",
                            root,
                            "--level",
                            level,
                            "--state-dir",
                            Path(d) / "st",
                            "--format",
                            "json",
                        ]
                    )
                    assert rc == 0 and json.loads(out)["latest_valid_checkpoint"]["path"].endswith(
                        "checkpoint-40"
                    )
        finally:
            for s, short in keep:
                s.close()
                short.unlink()
                short.parent.rmdir()


@FUZZ
@given(
    target=st.sampled_from(["dcp:.metadata", "dcp:__0_0.distcp", "pl:epoch=0-step=20.ckpt"]),
    kind=special_kinds,
    level=st.sampled_from(["quick", "full"]),
)
def test_fuzz_special_files_in_dcp_and_lightning_checkpoints(
    dcp_checkpoint, lightning_run, tmp_path, target, kind, level
):
    keep: list = []
    where, name = target.split(":")
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        if where == "dcp":
            root = Path(d) / "step-100"
            shutil.copytree(dcp_checkpoint, root)
            victim = root / name
        else:
            root = Path(d) / "ckpts"
            shutil.copytree(lightning_run.ckpt_dir, root)
            victim = root / name
        try:
            _make_special(victim, kind, keep)
            with no_hang():
                rc, out, err = _run(["validate", root, "--level", level, "--format", "json"])
            if rc == 2:  # nothing recognisable left
                assert where == "pl" or kind in ("loop", "dangling"), err
                return
            status = {Path(c["path"]).name: c["status"] for c in json.loads(out)["checkpoints"]}
            key = root.name if where == "dcp" else name
            assert rc == 1 and status.get(key, "absent") != "valid", status
        finally:
            for s, short in keep:
                s.close()
                short.unlink()
                short.parent.rmdir()
