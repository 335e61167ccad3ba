"""`Task`: what a handler gets for one leased task — the task's fields, `log()` and
`progress()`, and the flags that tell it to stop (lease lost, worker shutting down).

A handler may run in a thread of its own (a sync handler) while the worker's event loop reads
the progress for heartbeats, so the mutable parts are guarded by a lock."""

from __future__ import annotations

import json
import threading
from collections import deque
from datetime import datetime, timezone
from typing import Any

from starbridge._http import dumps
from starbridge._views import View

#: The most log text kept per attempt (its end); older lines are dropped and the logs say so.
MAX_LOG_BYTES = 64 * 1024
#: The most of a failure's traceback sent with its logs (its end, where the error is).
MAX_TRACEBACK_BYTES = 16 * 1024


class Flag:
    """A one-way flag, settable from any thread: once set it stays set."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


class Task:
    """One leased task, as its handler sees it.

    Fields (docs/reference.md 4.7): `id` (`tsk_…`), `job_id`, `step`, `queue`, `command`,
    `kind`, `item` (the fan-out index, else `None`), `input` (plain JSON: dicts and lists),
    `attempt` (from 1),
    `idempotency_key` (`<task id>:<attempt>`: the same across check-laters of one attempt; hand
    it to external systems so a retried attempt does not repeat a side effect), `callback_token`
    (a secret, for `AwaitCallback`), `traceparent` (the attempt's W3C trace context while the
    server exports OpenTelemetry traces, else `None`: spans the handler makes belong under it),
    `previous_progress` (what an earlier check-later of this attempt recorded) and `leased` (the
    whole leased task as the server sent it).
    """

    def __init__(self, leased: dict[str, Any], shutdown: Flag, abandoned: Flag) -> None:
        self.leased = View(leased)
        self.id: str = leased["id"]
        self.job_id: str = leased["job_id"]
        self.step: str = leased["step"]
        self.queue: str = leased["queue"]
        self.command: str = leased["command"]
        self.kind: str = leased["kind"]
        self.item: int | None = leased.get("item")
        self.input: Any = leased.get("input")
        self.attempt: int = leased["attempt"]
        self.idempotency_key: str = leased["idempotency_key"]
        self.callback_token: str = leased.get("callback_token") or ""
        self.traceparent: str | None = leased.get("traceparent")
        self.previous_progress: Any = leased.get("progress")
        self._lock = threading.Lock()
        self._lines: deque[str] = deque()
        self._log_bytes = 0
        self._dropped_lines = 0
        self._progress: Any = None
        self._progress_set = False
        self._lease_lost = Flag()
        self._shutdown = shutdown
        self._abandoned = abandoned

    def log(self, message: str, **fields: Any) -> None:
        """Adds a line to the attempt's logs, sent with its report (complete or fail) and shown
        with the task: `<UTC time> <message>`, then `fields` as JSON when given. The last 64 KiB
        are kept."""
        at = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        line = f"{at} {message}"
        if fields:
            line += " " + json.dumps(fields, ensure_ascii=False, default=str)
        size = len(line.encode()) + 1
        with self._lock:
            self._lines.append(line)
            self._log_bytes += size
            while self._log_bytes > MAX_LOG_BYTES and len(self._lines) > 1:
                self._log_bytes -= len(self._lines.popleft().encode()) + 1
                self._dropped_lines += 1

    def progress(self, value: Any) -> None:
        """Records the attempt's progress (any JSON; anything else raises `TypeError` or
        `ValueError` here): sent with the following heartbeats, shown with the task, and kept
        by a `CheckLater` that gives none of its own."""
        dumps(value)
        with self._lock:
            self._progress = value
            self._progress_set = True

    @property
    def cancelled(self) -> bool:
        """True once the attempt is no longer this worker's to finish: the server took the task
        away (a heartbeat was refused), or the worker abandoned it at the end of its shutdown
        grace period. Whatever the handler returns then is not reported: stop soon."""
        return self._lease_lost.is_set() or self._abandoned.is_set()

    @property
    def shutting_down(self) -> bool:
        """True once the worker is shutting down: finish within the grace period, or return
        early (a `CheckLater` with progress resumes the work elsewhere)."""
        return self._shutdown.is_set()

    def logs(self, traceback: str | None = None) -> dict[str, Any] | None:
        """The logs to report: `{"log": text}` (plus `traceback`, and `dropped_lines` when
        lines were dropped), or `None` when there are none."""
        with self._lock:
            logs: dict[str, Any] = {}
            if self._lines:
                logs["log"] = "\n".join(self._lines)
            if self._dropped_lines:
                logs["dropped_lines"] = self._dropped_lines
        if traceback:
            logs["traceback"] = traceback[-MAX_TRACEBACK_BYTES:]
        return logs or None

    def current_progress(self) -> tuple[bool, Any]:
        """Whether progress was set during this run, and its latest value."""
        with self._lock:
            return self._progress_set, self._progress

    def lose_lease(self) -> None:
        """The server took the task away: its outcome must not be reported."""
        self._lease_lost.set()

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost.is_set()

    def __repr__(self) -> str:
        return f"Task({self.id}, {self.step}/{self.command}, attempt {self.attempt})"
