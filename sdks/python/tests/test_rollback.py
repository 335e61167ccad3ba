"""Seed 000's multi-step task with Python handlers (examples/python/worker.py, the example the
README shows): a MySQL instance made in steps on several queues; when a step fails for good, the
finished steps are rolled back in reverse order, the failed step's own rollback first."""

from __future__ import annotations

from datetime import datetime

from conftest import Workers
from support import EXAMPLE_WORKER, EXAMPLE_WORKFLOW, STUCK

from starbridge import Client


def at(time: str) -> datetime:
    return datetime.fromisoformat(time.replace("Z", "+00:00"))


def test_the_instance_is_created_step_by_step(client: Client, workers: Workers) -> None:
    client.apply(EXAMPLE_WORKFLOW)
    workers.start(EXAMPLE_WORKER, "example")
    job = client.wait(client.submit("create_mysql_instance", params={"storage": 500}).id, timeout=STUCK)
    assert job.status == "succeeded"
    check, init, deduct = job.tasks
    assert [task.step for task in job.tasks] == ["check_resource", "init_instance", "deduct_resource"]
    assert init.input == {"storage": 500, "host": "db-7.internal"}
    assert init.output == {"instance_id": "i-" + job.id[-8:]}
    assert 'initialising {"host": "db-7.internal", "storage_gb": 500}' in init.logs.log
    assert deduct.output == {"deducted_gb": 500}  # the async handler


def test_a_failing_step_rolls_back_the_finished_ones_in_reverse_order(client: Client, workers: Workers) -> None:
    client.apply(EXAMPLE_WORKFLOW)
    workers.start(EXAMPLE_WORKER, "example")
    job = client.wait(client.submit("create_mysql_instance", params={"storage": 800}).id, timeout=STUCK)
    assert job.status == "failed"
    assert job.error == "step deduct_resource failed: quota exhausted: 800 GB asked, 600 GB left"
    steps = {task.step: task for task in job.tasks if task.kind == "step"}
    # NonRetryable: the step failed at its first attempt although it has two.
    deduct = steps["deduct_resource"]
    assert (deduct.status, deduct.attempt, deduct.max_attempts, deduct.error.retryable) == ("failed", 1, 2, False)
    undo = [task for task in job.tasks if task.kind == "compensation"]
    assert [(task.command, task.compensates, task.status) for task in undo] == [
        ("restore_resource", deduct.id, "succeeded"),
        ("clean_instance", steps["init_instance"].id, "succeeded"),
        ("report_event", steps["check_resource"].id, "succeeded"),
    ]
    restore, clean, report = undo
    # One at a time, in that order.
    assert at(restore.ended_at) <= at(clean.started_at) and at(clean.ended_at) <= at(report.started_at)
    assert restore.output == {"restored_gb": 0}  # nothing was deducted
    assert clean.output == {"removed": steps["init_instance"].output.instance_id}
    assert report.output == {"reported": "rolled back after check_resource"}
    [planned] = [event for event in client.events(job.id) if event.kind == "compensation_planned"]
    assert planned.detail.undo == [deduct.id, steps["init_instance"].id, steps["check_resource"].id]
