"""The worker protocol (`/api/v1/tasks/…`, docs/reference.md 4.7) as `Call`s: written once, sent
by the synchronous `Client` and by the `Worker`'s asynchronous transport alike. Task reports are
addressed by task id alone and carry the lease token; none is namespaced (a poll names its
namespace in its body)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Iterable, Mapping, Sequence

from starbridge._http import Call, ProblemError, milliseconds, post, segment, without_none
from starbridge._views import View

# The most items one batch request (`POST /api/v1/tasks/complete`), or one poll's `complete`, may
# carry.
MAX_BATCH_ITEMS = 1000
# How long past its `wait_ms` a long poll may take before the client gives up on it.
POLL_TIMEOUT_MARGIN = 15.0


def poll(
    queues: Sequence[str],
    *,
    worker_id: str,
    max_tasks: int,
    wait: float,
    namespace: str | None,
    complete: Sequence[Mapping[str, Any]] = (),
) -> Call:
    """`POST /api/v1/tasks/poll`: report the successes in `complete` (items of `complete_item`,
    answered in the answer's `reports`), then claim up to `max_tasks` tasks, waiting up to `wait`
    seconds."""
    wait_ms = milliseconds(wait)
    body = without_none(
        worker_id=worker_id,
        queues=list(queues),
        max_tasks=max_tasks,
        wait_ms=wait_ms,
        namespace=namespace,
    )
    if complete:
        # Sent only when there are some: a server from before `complete` refuses the field.
        body["complete"] = [dict(item) for item in complete]
    return post(
        "/api/v1/tasks/poll",
        body,
        namespaced=False,
        timeout=wait_ms / 1000 + POLL_TIMEOUT_MARGIN,
    )


def _report(task_id: str, report: str, body: Mapping[str, Any], timeout: float | None = None) -> Call:
    return post(f"/api/v1/tasks/{segment(task_id)}/{report}", dict(body), namespaced=False, timeout=timeout)


def heartbeat(task_id: str, lease_token: str, progress: Any = None, *, timeout: float | None = None) -> Call:
    """`POST /api/v1/tasks/{id}/heartbeat`: extend the lease, recording `progress`."""
    return _report(task_id, "heartbeat", {"lease_token": lease_token, "progress": progress}, timeout)


def complete(task_id: str, lease_token: str, output: Any = None, logs: Any = None) -> Call:
    """`POST /api/v1/tasks/{id}/complete`: the attempt succeeded with `output`."""
    return _report(task_id, "complete", {"lease_token": lease_token, "output": output, "logs": logs})


def complete_item(task_id: str, lease_token: str, output: Any = None, logs: Any = None) -> dict[str, Any]:
    """One item of `complete_many`."""
    return {"id": task_id, "lease_token": lease_token, "output": output, "logs": logs}


def complete_many(items: Iterable[Mapping[str, Any]]) -> Call:
    """`POST /api/v1/tasks/complete`: many successes in one request (items of `complete_item`)."""
    return post("/api/v1/tasks/complete", {"tasks": [dict(item) for item in items]}, namespaced=False)


def fail(task_id: str, lease_token: str, message: str, *, retryable: bool = True, logs: Any = None) -> Call:
    """`POST /api/v1/tasks/{id}/fail`: the attempt failed; not `retryable` fails the step for good."""
    body = {"lease_token": lease_token, "error": {"message": message, "retryable": retryable}, "logs": logs}
    return _report(task_id, "fail", body)


def check_later(task_id: str, lease_token: str, after: float | timedelta, progress: Any = None) -> Call:
    """`POST /api/v1/tasks/{id}/check-later`: not done yet, hand the task out again `after`
    (seconds or a `timedelta`) without using an attempt; `progress` comes back with it."""
    body = {"lease_token": lease_token, "after_ms": milliseconds(after), "progress": progress}
    return _report(task_id, "check-later", body)


def await_callback(task_id: str, lease_token: str, timeout: float | timedelta | None = None) -> Call:
    """`POST /api/v1/tasks/{id}/await-callback`: another system finishes the attempt through
    its callback token; the task waits at most `timeout` (default: the step's `timeout`)."""
    body = {"lease_token": lease_token, "timeout_ms": None if timeout is None else milliseconds(timeout)}
    return _report(task_id, "await-callback", body)


def batch_items(answer: Any) -> list[View | ProblemError]:
    """The items of a batch answer (`{items: [result or {error: problem}]}`), in order: a
    `View` per accepted item, a `ProblemError` (not raised) per refused one."""
    return _results(answer["items"])


def poll_reports(answer: Any) -> list[View | ProblemError]:
    """The answers to a poll's `complete` (its `reports`, as `batch_items`); none from a server
    that sends no `reports`."""
    return _results(answer.get("reports") or [])


def _results(items: Iterable[Any]) -> list[View | ProblemError]:
    results: list[View | ProblemError] = []
    for item in items:
        if isinstance(item, dict) and set(item) == {"error"} and isinstance(item["error"], dict):
            results.append(ProblemError(item["error"]))
        else:
            results.append(View(item))
    return results
