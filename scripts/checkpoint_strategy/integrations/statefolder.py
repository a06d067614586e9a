"""session-handoff's state folder (default `.claude/state`): merge, append, update, all locked.

Files:
  checkpoint-strategy.json  ours, replaced whole (atomic write)
  agent-state.json          the sibling's: we set next_step, last_updated and our own entries of
                            pending_risks, tagged "[checkpoint-strategy] " (plan only) or
                            "[checkpoint-strategy ROOT] " (a checkpoint folder): a new handoff
                            replaces the risks of its own scope only; every other field and every
                            other risk is kept as it was, in its order (atomic write)
  checkpoint.jsonl          the sibling's log: one line {ts, step, status, detail} appended
  NEXT_ACTION.md            our block between markers under "## Context for Next Session";
                            the rest of the file is kept byte for byte (atomic write)

Writers of this package hold an exclusive fcntl.flock on `.checkpoint-strategy.lock` in the
folder for the whole read-modify-write, so two handoffs at once both land. Every input is
read and checked before the first write, so bad input leaves every file as it was.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import stat as _stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from checkpoint_strategy.atomic import atomic_write_bytes, atomic_write_text, fsync_dir, write_temp
from checkpoint_strategy.errors import UsageError
from checkpoint_strategy.storage import ReadError, kind_of, loads_json, oserror_line, read_bytes
from checkpoint_strategy.storage.locking import locked as _locked

DEFAULT_STATE_DIR = ".claude/state"
HANDOFF_FILE = "checkpoint-strategy.json"
AGENT_STATE = "agent-state.json"
CHECKPOINT_LOG = "checkpoint.jsonl"
NEXT_ACTION = "NEXT_ACTION.md"
LOCK_FILE = ".checkpoint-strategy.lock"
RISK_TAG = "[checkpoint-strategy] "


def risk_tag(scope: Optional[str] = None) -> str:
    """The prefix of our pending_risks entries: one scope per checkpoint folder (or the plan)."""
    scope = " ".join(str(scope).split()).replace("]", ")") if scope else ""
    return f"[checkpoint-strategy {scope}] " if scope else RISK_TAG


BEGIN = "<!-- checkpoint-strategy:begin -->"
END = "<!-- checkpoint-strategy:end -->"
CONTEXT_HEADING = "Context for Next Session"
LOCK_TIMEOUT_SECONDS = 60.0
_HEADING = re.compile(r"^(#{1,6})\s*(.*?)\s*#*\s*$")


def _oserr(exc: OSError, action: str, path) -> UsageError:
    return UsageError(oserror_line(exc, action, path))


def prepare_dir(state_dir: str | os.PathLike) -> Path:
    """The state folder, created if missing. UsageError if it is a file or cannot be made."""
    d = Path(state_dir)
    if d.exists() and not d.is_dir():
        raise UsageError(
            f"state folder {d} is a file: expected a folder (default {DEFAULT_STATE_DIR})"
        )
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"cannot create state folder {d}: a file is in the way") from None
    except NotADirectoryError:
        raise UsageError(f"cannot create state folder {d}: a parent of it is a file") from None
    except OSError as exc:
        raise _oserr(exc, "create state folder", d) from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise UsageError(f"state folder {d} is not writable")
    return d


@contextlib.contextmanager
def locked(state_dir: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
    """Exclusive lock on the state folder for the duration of the block (storage.locking)."""
    path = state_dir / LOCK_FILE
    busy = (
        f"state folder {state_dir} is locked by another checkpoint-strategy process for more than "
        f"{timeout:g} s ({path})"
    )
    with _locked(path, timeout, busy):
        yield


def _read_existing(path: Path, what: str) -> Optional[str]:
    """The file's text (bytes decoded as is: CRLF stays CRLF), None when absent. A FIFO, device or
    folder in its place is refused without opening it."""
    if not os.path.lexists(path):
        return None
    try:
        data = read_bytes(path, what)
    except ReadError as exc:
        raise UsageError(
            f"{what} {path}: {exc.reason}; fix or move it, nothing was written"
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text; fix or move it") from None


def _must_be_file_or_absent(path: Path, what: str) -> None:
    """A file we write must be a regular file (or not exist yet): never a FIFO, device or folder."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _oserr(exc, f"read {what}", path) from None

    if not _stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"{what} {path} is {kind_of(st.st_mode)}: expected a regular file; "
            "fix or move it, nothing was written"
        )


# --------------------------------------------------------------------------- agent-state.json


def merge_agent_state(
    existing: Optional[str],
    risks: list[str],
    next_step: str,
    now: str,
    where: str = AGENT_STATE,
    scope: Optional[str] = None,
) -> str:
    """The new agent-state.json text. Unknown fields and other writers' risks are kept in order."""
    if existing is None or not existing.strip():
        data: dict = {
            "schema_version": 1,
            "session_id": None,
            "status": "in_progress",
            "last_updated": now,
            "next_step": next_step,
            "completed_steps": [],
            "notes": [],
            "pending_risks": [],
        }
    else:
        try:  # the sibling's file: NaN written by Python's json is kept as it was
            data = loads_json(existing, where, allow_nan=True, expect=dict)
        except ReadError as exc:
            raise UsageError(
                f"{where} is {exc.reason}; fix or move it, nothing was written"
            ) from None
    old = data.get("pending_risks")
    if old is None:
        old = []
    elif not isinstance(old, list):
        old = [old]
    tag = risk_tag(scope)
    kept = [r for r in old if not (isinstance(r, str) and r.startswith(tag))]
    data["pending_risks"] = kept + [tag + r for r in risks]
    data["next_step"] = next_step
    data["last_updated"] = now
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- NEXT_ACTION.md


def update_next_action(existing: Optional[str], block: str, where: str = NEXT_ACTION) -> str:
    """Put `block` (which carries the BEGIN/END markers) under "Context for Next Session"."""
    block = block.rstrip("\n") + "\n"
    if existing is None:
        return f"# NEXT ACTION\n\n## {CONTEXT_HEADING}\n\n{block}"
    begins, ends = existing.count(BEGIN), existing.count(END)
    if begins or ends:
        start, stop = existing.find(BEGIN), existing.find(END)
        if begins != 1 or ends != 1 or stop < start:
            raise UsageError(
                f"{where} has unmatched {BEGIN} / {END} markers; fix them, nothing was written"
            )
        stop += len(END)
        if existing[stop : stop + 1] == "\n":
            stop += 1
        return existing[:start] + block + existing[stop:]
    lines = existing.splitlines(keepends=True)
    for i, line in enumerate(lines):
        m = _HEADING.match(line.rstrip("\r\n"))
        if m and m.group(2).strip().lower() == CONTEXT_HEADING.lower():
            level = len(m.group(1))
            end = len(lines)
            for j in range(i + 1, len(lines)):
                m2 = _HEADING.match(lines[j].rstrip("\r\n"))
                if m2 and len(m2.group(1)) <= level:
                    end = j
                    break
            before = "".join(lines[:end])
            if not before.endswith("\n"):
                before += "\n"
            if not before.endswith(("\n\n", "\n\r\n")):
                before += "\n"
            after = "".join(lines[end:])
            return before + block + ("\n" + after if after else "")
    text = existing if existing.endswith("\n") else existing + "\n"
    return f"{text}\n## {CONTEXT_HEADING}\n\n{block}"


# --------------------------------------------------------------------------- checkpoint.jsonl


def append_line(path: Path, record: dict) -> None:
    """Append one JSON line with a single write; a missing final newline is added first."""
    line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    except IsADirectoryError:
        raise UsageError(f"{CHECKPOINT_LOG} {path} is a folder: expected a file") from None
    except OSError as exc:
        raise _oserr(exc, "open", path) from None
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{CHECKPOINT_LOG} {path} is not a regular file: nothing appended")
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        data = line.encode("utf-8")
        written = os.write(fd, data)
        if written != len(data):
            raise UsageError(f"short write to {path}: disk full?")
        os.fsync(fd)
    except OSError as exc:
        raise _oserr(exc, "append to", path) from None
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the whole handoff write


@dataclass
class StateWrite:
    handoff_json: str
    risks: list[str]
    next_step: str
    block: str
    log_record: dict
    now: str
    scope: Optional[str] = None
    written: list[str] = field(default_factory=list)


def write_state(state_dir: str | os.PathLike, w: StateWrite) -> list[str]:
    """Write the four files under the folder lock, all or nothing. Returns the paths written.

    Every input is read and checked, and the three whole files are prepared as fsynced temp files,
    before the first rename. Then, in a fixed order: checkpoint-strategy.json, agent-state.json,
    NEXT_ACTION.md are renamed into place and the checkpoint.jsonl line is appended last. If any
    step fails, the files already replaced are put back (their previous version was hard-linked
    aside first) and the command exits 2: nothing was written. A handoff killed half-way is
    rolled back by the next one (see _commit).
    """
    d = prepare_dir(state_dir)
    paths = {name: d / name for name in (HANDOFF_FILE, AGENT_STATE, CHECKPOINT_LOG, NEXT_ACTION)}
    with locked(d):
        recover_interrupted(d)
        for name in (HANDOFF_FILE, AGENT_STATE, CHECKPOINT_LOG, NEXT_ACTION):
            _must_be_file_or_absent(paths[name], name)
        # read and check everything first: nothing is written if any input is bad
        state_text = merge_agent_state(
            _read_existing(paths[AGENT_STATE], AGENT_STATE),
            w.risks,
            w.next_step,
            w.now,
            where=str(paths[AGENT_STATE]),
            scope=w.scope,
        )
        next_text = update_next_action(
            _read_existing(paths[NEXT_ACTION], NEXT_ACTION), w.block, where=str(paths[NEXT_ACTION])
        )
        _commit(
            d,
            [
                (paths[HANDOFF_FILE], w.handoff_json),
                (paths[AGENT_STATE], state_text),
                (paths[NEXT_ACTION], next_text),
            ],
            paths[CHECKPOINT_LOG],
            w.log_record,
        )
    w.written = [str(paths[n]) for n in (HANDOFF_FILE, AGENT_STATE, CHECKPOINT_LOG, NEXT_ACTION)]
    return w.written


JOURNAL = ".checkpoint-strategy.commit"


def _commit(d: Path, files: list[tuple[Path, str]], log_path: Path, record: dict) -> None:
    """Prepare every temp file, then rename in order and append; roll back on any failure.

    A journal (JOURNAL, written before the first rename, removed after the append) names the
    previous version of each file, hard-linked aside as `.NAME.bak`: a handoff killed half-way
    (kill -9, power loss) is rolled back by the next one, under the same lock.
    """
    temps: list[str] = []
    plan: dict[str, dict] = {}
    in_memory: dict[str, bytes] = {}

    def _fail(exc: BaseException) -> UsageError:
        reason = (
            str(exc)
            if isinstance(exc, UsageError)
            else oserror_line(exc, "write to state folder", d)
        )
        return UsageError(f"{reason}; nothing was written (every file of {d} is as it was)")

    try:
        for path, text in files:
            temps.append(write_temp(path, text.encode("utf-8")))
        for path, _text in files:
            if not os.path.lexists(path):
                plan[path.name] = {"new": True}
                continue
            link = d / f".{path.name}.bak"
            _unlink_quiet(link)
            try:
                os.link(path, link)  # the previous version, kept until every step succeeded
                plan[path.name] = {"backup": link.name}
            except OSError:  # a file system without hard links: keep the bytes (no crash recovery)
                in_memory[path.name] = read_bytes(path, path.name)
                plan[path.name] = {"kept": True}
        atomic_write_text(d / JOURNAL, json.dumps(plan))
    except (OSError, UsageError) as exc:
        for t in temps:
            _unlink_quiet(t)
        _roll_back(d, plan, {}, only_backups=True)
        raise _fail(exc) from None
    try:
        for (path, _text), tmp in zip(files, temps, strict=False):
            os.replace(tmp, path)
        append_line(log_path, record)
    except (OSError, UsageError) as exc:
        _roll_back(d, plan, in_memory)
        for t in temps:
            _unlink_quiet(t)
        raise _fail(exc) from None
    _unlink_quiet(d / JOURNAL)  # the commit point
    fsync_dir(d)
    _roll_back(d, plan, {}, only_backups=True)


def _roll_back(
    d: Path, plan: dict, in_memory: dict[str, bytes], only_backups: bool = False
) -> None:
    """Put back the previous version of every file in `plan` (or, only_backups, just drop the
    backup links), then remove the journal."""
    for name, how in plan.items():
        if name not in (HANDOFF_FILE, AGENT_STATE, NEXT_ACTION) or not isinstance(how, dict):
            continue  # a journal names only our three files
        path = d / name
        backup = d / f".{name}.bak"
        try:
            if only_backups:
                if how.get("backup"):
                    _unlink_quiet(backup)
            elif how.get("backup") and os.path.lexists(backup):
                if os.path.lexists(path) and os.path.samefile(backup, path):
                    os.unlink(
                        backup
                    )  # never replaced (rename of two links to one file does nothing)
                else:
                    os.replace(backup, path)
            elif how.get("new"):
                _unlink_quiet(path)
            elif name in in_memory:
                atomic_write_bytes(path, in_memory[name])
        except OSError:
            pass
    if not only_backups:
        _unlink_quiet(d / JOURNAL)
    fsync_dir(d)


def recover_interrupted(d: Path) -> bool:
    """Under the lock: roll back a handoff that was killed between its first rename and its
    commit point, and remove temp files left by any killed write. True when one was rolled back."""
    for name in (HANDOFF_FILE, AGENT_STATE, NEXT_ACTION):
        for tmp in glob.glob(os.path.join(glob.escape(str(d)), f".{glob.escape(name)}.*.tmp")):
            _unlink_quiet(tmp)
    journal = d / JOURNAL
    if not os.path.lexists(journal):
        return False
    try:
        plan = loads_json(read_bytes(journal, JOURNAL, limit=1 << 16), JOURNAL, expect=dict)
    except ReadError:
        plan = {}
    _roll_back(d, plan, {})
    _unlink_quiet(journal)
    return True


def _unlink_quiet(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
