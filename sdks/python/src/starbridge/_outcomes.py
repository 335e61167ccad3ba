"""What a handler may end an attempt with besides returning its output or raising:
`CheckLater` and `AwaitCallback` (returned), `NonRetryable` (raised)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class CheckLater:
    """Return it when the work is not done yet: the server hands the task out again `after`
    (seconds or a `timedelta`) **without using an attempt**; the next run of the attempt gets
    `progress` back as `Task.previous_progress` (when `None`: the last `Task.progress(...)` of
    this run, else what the server recorded before). Bounded only by the step's
    `step_timeout`."""

    after: float | timedelta
    progress: Any = None


@dataclass(frozen=True)
class AwaitCallback:
    """Return it after handing the work to another system along with `Task.callback_token`:
    the worker lets go of the task, which waits holding no worker until that system calls
    `POST /api/v1/callbacks/{token}/complete` (or `/fail`, `/heartbeat`), for at most `timeout`
    (seconds or a `timedelta`; `None`: the step's per-attempt `timeout`)."""

    timeout: float | timedelta | None = None


class NonRetryable(Exception):
    """Raise it to fail the step at once, without further attempts (any other exception is a
    retryable failure, tried again while the step's retry policy allows)."""
