"""Errors that end a command with exit code 2 and one line on stderr."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: arguments, files, logs, checkpoints or events.

    The message is one line that names what is wrong and what is expected.
    """

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


#: what follows "log NAME" when a training log has nothing in it to read (an empty log_history or list)
NO_LOG_ENTRIES = " has no log entries (empty log_history or list)"


def no_log_entries(log: object) -> UsageError:
    """A training log with nothing in it to read: written once, for the log readers (recovery) and for the spike
    check that answers without loading them (retention.safety)."""
    return UsageError(f"log {log}{NO_LOG_ENTRIES}")


def pydantic_message(exc: Exception, what: str = "input") -> str:
    """Turn a pydantic ValidationError into one readable line."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return f"invalid {what}: {exc}"
    parts = []
    for err in errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or what
        parts.append(f"{loc}: {err.get('msg', 'invalid value')}")
    return f"invalid {what}: " + "; ".join(parts)
