"""The SDK's pure parts, without a server: reading a definition's name, views, problem documents
made from answers that are not one, and how a handler's result becomes a report (including
the `max_output_bytes` refusal, which needs a server that sends the limit), and how the poll
loop takes its free slots."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from starbridge import AwaitCallback, CheckLater, NonRetryable, ProblemError, View, Worker
from starbridge._definitions import name_in_text
from starbridge._http import milliseconds, problem_from_answer
from starbridge._task import MAX_LOG_BYTES, Flag, Task
from starbridge._worker import _Slots, heartbeat_interval, is_coroutine_function, output_refusal, refuses_complete, report_for


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("name: plain\nsteps: []\n", "plain"),
        ("# heading\nname: 'single'  # comment\n", "single"),
        ('description: x\nname: "double"\n', "double"),
        ("steps:\n  - name: nested\n", None),
        ('{"name": "json", "steps": []}', "json"),
        ("{name: flow-yaml}", None),
        ("steps: []\n", None),
    ],
)
def test_the_name_is_read_from_a_definition_text(text: str, name: str | None) -> None:
    assert name_in_text(text) == name


def test_views_read_by_attribute_and_key() -> None:
    view = View({"id": "job_1", "tasks": [{"step": "a", "output": {"n": 1}}], "items": 3})
    assert view.id == view["id"] == "job_1"
    assert view.tasks[0].output.n == 1 and view.items == 3
    assert view == {"id": "job_1", "tasks": [{"step": "a", "output": {"n": 1}}], "items": 3}
    assert view.get("missing", 7) == 7 and "id" in view and list(view) == ["id", "tasks", "items"]
    with pytest.raises(AttributeError, match="has no field 'nope'"):
        view.nope
    with pytest.raises(AttributeError):
        view.id = "other"


def test_an_answer_that_is_not_a_problem_document_becomes_one() -> None:
    unhealthy = ProblemError(problem_from_answer(503, "Service Unavailable", b'{"status": "unhealthy", "detail": "disk full"}'))
    assert (unhealthy.status, unhealthy.title, unhealthy.detail, unhealthy.retryable) == (503, "Service Unavailable", "disk full", True)
    proxy = ProblemError(problem_from_answer(502, "Bad Gateway", b"<html>upstream down</html>"))
    assert (proxy.status, proxy.detail) == (502, "<html>upstream down</html>")
    claimed = ProblemError(problem_from_answer(409, "Conflict", b'{"type": "/problems/conflict", "title": "Conflict", "status": 200, "detail": "stale lease"}'))
    assert (claimed.status, str(claimed)) == (409, "Conflict (409): stale lease")


def test_durations_are_seconds_or_timedeltas() -> None:
    assert milliseconds(1.5) == milliseconds(timedelta(seconds=1.5)) == 1500
    with pytest.raises(ValueError):
        milliseconds(-1)


def leased_task(**more: Any) -> Task:
    leased = {
        "id": "tsk_1", "lease_token": "lease", "job_id": "job_1", "step": "s", "kind": "step", "item": None,
        "queue": "q", "command": "c", "input": {"n": 1}, "attempt": 1, "idempotency_key": "tsk_1:1",
        "lease_expires_at": "2026-11-24T07:11:54.224Z", "lease_ms": 300000, "progress": None, "callback_token": "cb",
        **more,
    }
    return Task(leased, Flag(), Flag())


def test_a_task_has_its_attempts_traceparent_only_when_the_server_traces() -> None:
    assert leased_task().traceparent is None
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert leased_task(traceparent=traceparent).traceparent == traceparent


def report_body(returned: Any = None, raised: BaseException | None = None, limit: int | None = None) -> tuple[str, dict[str, Any]]:
    report = report_for(leased_task(), returned, raised, limit)
    return report.kind, report.call.body


def test_an_output_over_max_output_bytes_fails_the_step_for_good() -> None:
    output = {"blob": "x" * 100}
    assert output_refusal(output, 200) is None
    kind, body = report_body(output, limit=50)
    assert kind == "fail" and body["error"]["retryable"] is False
    assert body["error"]["message"].startswith("the handler's output is 111 bytes as JSON, more than the 50 bytes")
    assert report_body(output, limit=111)[0] == "complete"
    kind, body = report_body({"when": object()})
    assert (kind, body["error"]["retryable"]) == ("fail", False)
    assert body["error"]["message"].startswith("the handler's output is not JSON")


def test_handler_results_become_reports() -> None:
    assert report_body({"ok": True}) == ("complete", {"lease_token": "lease", "output": {"ok": True}, "logs": None})
    assert report_body(CheckLater(after=timedelta(seconds=2), progress={"p": 1})) == (
        "check-later", {"lease_token": "lease", "after_ms": 2000, "progress": {"p": 1}}
    )
    assert report_body(AwaitCallback()) == ("await-callback", {"lease_token": "lease", "timeout_ms": None})
    kind, body = report_body(raised=NonRetryable("quota exhausted"))
    assert (kind, body["error"]) == ("fail", {"message": "quota exhausted", "retryable": False})
    kind, body = report_body(raised=KeyError("host"))
    assert body["error"] == {"message": "KeyError: 'host'", "retryable": True}
    assert "KeyError" in body["logs"]["traceback"]


def test_check_later_keeps_the_progress_the_handler_set() -> None:
    task = leased_task()
    task.progress({"copied": 3})
    report = report_for(task, CheckLater(after=1), None, None)
    assert report.call.body["progress"] == {"copied": 3}


def test_logs_keep_their_end() -> None:
    task = leased_task()
    for n in range(2000):
        task.log(f"line {n}", padding="x" * 40)
    logs = task.logs()
    assert logs is not None and len(logs["log"].encode()) <= MAX_LOG_BYTES
    assert logs["log"].endswith('line 1999 {"padding": "' + "x" * 40 + '"}') and logs["dropped_lines"] > 0


def test_progress_must_be_json() -> None:
    with pytest.raises(TypeError):
        leased_task().progress({"at": object()})


def test_a_worker_refuses_handlers_it_would_never_poll_for() -> None:
    worker = Worker("http://127.0.0.1:1", queues=["mysql"])
    with pytest.raises(ValueError, match="not among the queues polled"):
        worker.handler("resource", "deduct_resource")
    with pytest.raises(ValueError, match="concurrency"):
        Worker("http://127.0.0.1:1", concurrency=0)


class AsyncCallable:
    async def __call__(self, task: Task) -> None:
        return None


def test_async_callables_run_on_the_event_loop() -> None:
    assert is_coroutine_function(AsyncCallable())
    assert not is_coroutine_function(lambda task: None)


def test_heartbeats_come_every_third_of_the_lease_and_at_least_every_10_s() -> None:
    assert heartbeat_interval(6.0) == 2.0
    assert heartbeat_interval(300.0) == 10.0
    assert heartbeat_interval(0.15) == 0.1


def test_a_poll_refused_for_its_complete_field_says_the_server_predates_it_and_one_item_does_not() -> None:
    def refusal(field: str, message: str, status: int = 400) -> ProblemError:
        return ProblemError({"status": status, "title": "Invalid request", "errors": [{"field": field, "message": message}]})

    older = refusal("body", "unknown field `complete`, expected one of `worker_id`, `queues` (line 1 column 80)")
    assert refuses_complete(older)
    assert refuses_complete(refusal("complete", "give at most 1000 items", 422))
    assert not refuses_complete(refusal("complete[1].lease_token", "a NUL", 422))
    assert not refuses_complete(refusal("wait_ms", "at most 60000"))
    assert not refuses_complete(refusal("complete", "unavailable", 503))


def _slots_taken(total: int, free: int, ending: list[tuple[int, int]], *, settle: bool) -> int:
    """How many of `total` slots the poll loop takes with `free` free now while tasks end: each
    `(count, yields)` of `ending` frees `count` slots after the event loop ran it `yields` times."""

    async def free_later(slots: _Slots, count: int, yields: int) -> None:
        for _ in range(yields):
            await asyncio.sleep(0)
        slots.give(count)

    async def run() -> int:
        slots = _Slots(total)
        slots.take_free()
        slots.give(free)
        later = [asyncio.ensure_future(free_later(slots, count, yields)) for count, yields in ending]
        taken = await slots.take_all(settle=settle)
        await asyncio.gather(*later)
        return taken

    return asyncio.run(run())


def test_after_a_backlog_a_poll_takes_the_slots_of_tasks_ending_after_the_first() -> None:
    assert _slots_taken(8, 0, [(1, task) for task in range(8)], settle=True) == 8


def test_without_a_backlog_a_poll_goes_with_the_slots_free_now() -> None:
    assert _slots_taken(8, 1, [(7, 1)], settle=False) == 1


def test_a_poll_does_not_wait_for_a_slot_whose_task_is_still_at_work() -> None:
    assert _slots_taken(4, 3, [], settle=True) == 3
