"""The Client against a real server: applying definitions in every form, problems naming their
field, paged lists, batch submission, operator actions, signals and approvals, queues,
schedules, webhooks (delivered to a real receiver on loopback), tokens, audit and health."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
from support import EXAMPLE_WORKFLOW, STUCK, eventually

from starbridge import Client, ProblemError, View

# A workflow that runs without any worker: it waits on the server for a signal, then approval.
OPS = {
    "name": "ops",
    "labels": {"team": "storage"},
    "steps": [
        {"id": "paid", "signal": "payment_received"},
        {"id": "approve", "approval": {"prompt": "Ship order ${{ params.order }}?"}},
    ],
}


def awaiting_approval(client: Client, job_id: str) -> bool:
    return any(approval.job_id == job_id for approval in client.approvals())


def test_apply_takes_a_path_a_yaml_or_json_text_or_a_dict(client: Client) -> None:
    applied = client.apply(str(EXAMPLE_WORKFLOW))
    assert (applied.name, applied.version, applied.created) == ("create_mysql_instance", 1, True)
    assert client.apply(EXAMPLE_WORKFLOW).created is False  # a Path; unchanged
    text = "# comment\nname: 'texty'   # quoted, commented\nsteps:\n  - {id: a, queue: q, command: c}\n"
    assert client.apply(text).name == "texty"
    assert client.apply(json.dumps({"name": "jsony", "steps": [{"id": "a", "queue": "q", "command": "c"}]})).name == "jsony"
    assert client.apply({"name": "dicty", "steps": [{"id": "a", "queue": "q", "command": "c"}]}).name == "dicty"
    assert client.workflow("texty").definition.steps[0].command == "c"
    assert [workflow.name for workflow in client.workflows()] == ["create_mysql_instance", "dicty", "jsony", "texty"]
    # The server checks the document's name against the one it is applied as.
    with pytest.raises(ProblemError) as refused:
        client.apply(text, name="other")
    assert (refused.value.status, refused.value.fields) == (422, ["name"])
    # Another namespace holds none of them.
    with Client(client.connection.base_url, namespace="team-a") as other:
        assert other.workflows() == []


def test_a_refused_request_raises_a_problem_error_naming_the_field(client: Client) -> None:
    client.apply(EXAMPLE_WORKFLOW)
    with pytest.raises(ProblemError) as invalid:
        client.submit("create_mysql_instance", params={"storage": "lots"})
    problem = invalid.value
    assert (problem.status, problem.type, problem.title) == (422, "/problems/validation", "Validation failed")
    assert problem.fields == ["params.storage"]
    assert "params.storage" in str(problem) and problem.problem["status"] == 422
    assert not problem.retryable
    with pytest.raises(ProblemError) as bad_definition:
        client.apply({"name": "bad", "steps": [{"id": "a", "queue": "q", "command": 5}]})
    assert bad_definition.value.fields == ["steps[0] (a).command"]
    with pytest.raises(ProblemError) as bad_query:
        client.jobs_page(limit=0)
    assert (bad_query.value.status, bad_query.value.fields) == (400, ["limit"])
    with pytest.raises(ProblemError) as missing:
        client.job("job_01a20e2d44647330a07916be1fffde63")
    assert (missing.value.status, missing.value.type) == (404, "/problems/not-found")


def test_paged_lists_are_iterated_to_the_end(client: Client) -> None:
    client.apply(OPS)
    submitted = [client.submit("ops", {"order": n}).id for n in range(7)]
    first = client.jobs_page(workflow="ops", limit=3)
    assert len(first.items) == 3 and first.next_cursor
    assert [job.id for job in client.jobs(workflow="ops", page_size=3)] == submitted[::-1]  # newest first
    assert [job.id for job in client.jobs(labels={"team": "storage"}, page_size=2)] == submitted[::-1]
    assert list(client.jobs(labels={"team": "nobody"})) == []
    client.signal(submitted[0], "payment_received")
    events = list(client.events(submitted[0], page_size=2))
    assert len(events) >= 5 and events == list(client.events(submitted[0]))
    assert [event.seq for event in events] == sorted(event.seq for event in events)
    for _ in range(3):
        client.pause_queue("mysql")
    audit = list(client.audit(page_size=2))
    assert len(audit) == 4 and audit == list(client.audit())
    assert [entry.action for entry in audit] == ["POST /api/v1/queues/{name}/pause"] * 3 + ["PUT /api/v1/workflows/{name}"]


def test_batch_submission_answers_each_item(client: Client) -> None:
    client.apply(OPS)
    created, refused, repeated = client.submit_batch(
        [{"workflow": "ops", "key": "order-1"}, {"workflow": "missing"}, {"workflow": "ops", "key": "order-1"}]
    )
    assert isinstance(created, View) and created.created is True
    assert isinstance(refused, ProblemError) and refused.status == 404
    assert isinstance(repeated, View) and (repeated.id, repeated.created) == (created.id, False)
    # A key already used returns the same job from the single submission too.
    assert client.submit("ops", key="order-1").id == created.id


def test_operator_actions_signals_and_approvals(client: Client) -> None:
    client.apply(OPS)
    job = client.submit("ops", {"order": 1})
    assert client.pause(job.id, reason="maintenance window").status == "paused"
    assert client.resume(job.id).status == "running"
    accepted = client.signal(job.id, "payment_received", {"ok": True}, id="pay-1")
    assert (accepted.taken, accepted.duplicate) == (True, False)
    assert client.signal(job.id, "payment_received", {"ok": True}, id="pay-1").duplicate is True
    eventually(lambda: awaiting_approval(client, job.id), "the approval step to wait")
    [approval] = client.approvals()
    assert (approval.step, approval.prompt) == ("approve", "Ship order 1?")
    client.approve(job.id, "approve", comment="go")
    job = client.wait(job.id, timeout=STUCK)
    assert job.status == "succeeded"
    paid, approved = job.tasks
    assert paid.output == {"ok": True}
    assert (approved.output.approved, approved.output.comment) == (True, "go")
    kinds = [event.kind for event in client.events(job.id)]
    for kind in ("job_paused", "job_resumed", "signal_received", "task_approved", "job_succeeded"):
        assert kind in kinds

    # Rejected, it fails; retried, it waits for a decision again; rerun, the step runs again.
    job = client.submit("ops", {"order": 2})
    client.signal(job.id, "payment_received", {"ok": True})
    eventually(lambda: awaiting_approval(client, job.id), "the approval step to wait")
    client.reject(job.id, job.tasks[1].id, comment="not today")
    assert client.wait(job.id, timeout=STUCK).status == "failed"
    assert client.retry(job.id, reason="try again").status == "running"
    eventually(lambda: awaiting_approval(client, job.id), "the retried approval step to wait")
    client.approve(job.id, "approve")
    assert client.wait(job.id, timeout=STUCK).status == "succeeded"
    assert client.rerun(job.id, "approve").status == "running"
    eventually(lambda: awaiting_approval(client, job.id), "the rerun approval step to wait")
    with pytest.raises(ProblemError) as conflict:
        client.retry(job.id)
    assert conflict.value.status == 409
    assert client.cancel(job.id, reason="no longer needed").status == "cancelled"

    # Skipped by hand, a step succeeds with the output given; bulk acts on what a filter selects.
    job = client.submit("ops", {"order": 3})
    skipped = client.skip(job.id, "paid", output={"ok": "by hand"})
    assert skipped.tasks[0].output == {"ok": "by hand"}
    bulk = client.bulk("cancel", workflow="ops", labels={"team": "storage"}, status="running", reason="cleanup")
    assert (bulk.matched, bulk.affected, bulk.refused) == (1, 1, [])
    assert client.job(job.id).status == "cancelled"

    # Bulk skip and rerun name the step; a dry run only counts the jobs.
    other = client.submit("ops", {"order": 4})
    counted = client.bulk("skip", ids=[other.id, job.id], dry_run=True)
    assert (counted.matched, counted.affected) == (2, 0)
    skipped = client.bulk("skip", ids=[other.id, job.id], step="paid", output={"ok": "in bulk"})
    assert (skipped.matched, skipped.affected) == (2, 1)
    assert skipped.refused[0].id == job.id
    assert client.job(other.id).tasks[0].output == {"ok": "in bulk"}
    rerun = client.bulk("rerun", ids=[job.id], step="paid", reason="once more")
    assert (rerun.matched, rerun.affected, rerun.refused) == (1, 1, [])
    assert client.cancel(job.id).status == "cancelled"
    client.cancel(other.id)

    # A finished job is deleted with its history; an unknown one is a 404.
    client.delete_job(job.id)
    with pytest.raises(ProblemError) as gone:
        client.job(job.id)
    assert gone.value.status == 404

    # A workflow with jobs that could still be retried is kept; without them it is hidden.
    with pytest.raises(ProblemError) as in_use:
        client.delete_workflow("ops")
    assert in_use.value.status == 409
    assert "could still run or be retried" in in_use.value.detail
    client.bulk("delete", workflow="ops", reason="cleanup")
    client.delete_workflow("ops")
    assert "ops" not in [workflow.name for workflow in client.workflows()]


class Receiver(BaseHTTPRequestHandler):
    """A webhook receiver on loopback: records each body and answers 200."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.received = []
    http = HTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.server_address[1]}/hook"
    http.shutdown()
    http.server_close()


def test_queues_schedules_webhooks_tokens_and_health(client: Client, receiver: str) -> None:
    assert client.health().status == "ok"
    assert "starbridge_build_info" in client.metrics()
    assert "/api/v1/tasks/poll" in client.openapi()["paths"]

    queue = client.configure_queue("mysql", concurrency=2, mode="serial", max_wait="1m")
    assert (queue.concurrency, queue.mode, queue.max_wait_ms) == (2, "serial", 60000)
    assert client.configure_queue("mysql", concurrency=None).concurrency is None
    assert client.pause_queue("mysql").paused is True
    assert client.resume_queue("mysql").paused is False
    assert client.configure_queue("team/a", priority=3).name == "team/a"  # "/" travels as %2F
    assert client.queue("team/a").priority == 3
    assert [queue.name for queue in client.queues()] == ["mysql", "team/a"]

    client.apply(OPS)
    schedule = client.put_schedule("nightly", "ops", "0 3 * * *", params={"order": 9}, timezone="Europe/Berlin")
    assert (schedule.workflow, schedule.timezone, len(schedule.next_fires)) == ("ops", "Europe/Berlin", 5)
    assert client.pause_schedule("nightly").paused is True
    assert client.resume_schedule("nightly").paused is False
    assert [schedule.name for schedule in client.schedules()] == ["nightly"]
    client.delete_schedule("nightly")
    with pytest.raises(ProblemError) as gone:
        client.schedule("nightly")
    assert gone.value.status == 404

    with pytest.raises(ProblemError) as refused:
        client.add_webhook("http://10.1.2.3/hook")  # a private address: refused, never contacted
    assert refused.value.fields == ["url"]
    webhook = client.add_webhook(receiver, workflow="ops", states=["cancelled"])
    assert len(webhook.secret) == 64
    job = client.submit("ops", {"order": 4})
    client.cancel(job.id)

    def delivered() -> list[View]:
        return [delivery for delivery in client.deliveries(webhook.id) if delivery.state == "delivered"]

    [delivery] = eventually(delivered, "the webhook's delivery")
    assert (delivery.job_id, delivery.status) == (job.id, "cancelled")
    assert Receiver.received[0]["job"]["id"] == job.id
    assert [hook.id for hook in client.webhooks()] == [webhook.id]
    client.delete_webhook(webhook.id)
    assert client.webhooks() == []
    with pytest.raises(ProblemError) as unknown:
        client.add_webhook(receiver, events=["task.failed", "task.exploded"])
    assert unknown.value.fields == ["events[1]"]
    tasks = client.add_webhook(receiver, workflow="ops", events=["task.failed", "task.retrying"], steps=["x"])
    assert (tasks.events, tasks.steps) == (["task.failed", "task.retrying"], ["x"])
    client.delete_webhook(tasks.id)

    created = client.create_token("ci-reader", ["read"], reason="dashboards")
    assert created.secret.startswith("sbt_") and created.token.scopes == ["read"]
    assert [token.name for token in client.tokens()] == ["ci-reader"]
    assert client.revoke_token(created.token.id).revoked_at is not None
    actions = [entry.action for entry in client.audit()]
    assert "POST /api/v1/tokens" in actions and "DELETE /api/v1/tokens/{id}" in actions


def test_the_worker_protocol_by_hand(client: Client, tmp_path: Path) -> None:
    client.apply({"name": "manual", "steps": [{"id": "a", "queue": "hand", "command": "c", "retry": {"max_attempts": 2, "initial": "1ms"}}, {"id": "b", "queue": "hand", "command": "c"}]})
    job = client.submit("manual")
    [task] = client.poll(["hand"], worker_id="by-hand", wait=5)
    assert client.heartbeat(task.id, task.lease_token, progress={"half": True}).lease_expires_at
    assert client.check_later(task.id, task.lease_token, 0, progress={"n": 1}).task_status == "ready"
    [task] = client.poll(["hand"], worker_id="by-hand", wait=5)
    assert (task.attempt, task.progress) == (1, {"n": 1})
    assert client.fail(task.id, task.lease_token, "busy").task_status == "ready"
    [task] = client.poll(["hand"], worker_id="by-hand", wait=5)
    assert task.attempt == 2
    [done, stale] = client.complete_many(
        [{"id": task.id, "lease_token": task.lease_token, "output": {"ok": 1}}, {"id": task.id, "lease_token": "stale"}]
    )
    assert isinstance(done, View) and done.task_status == "succeeded"
    assert isinstance(stale, ProblemError) and stale.status == 409
    [second] = client.poll(["hand"], worker_id="by-hand", wait=5)
    assert client.await_callback(second.id, second.lease_token, timeout=60).task_status == "running"
    assert client.callback_heartbeat(second.callback_token).result == "extended"
    assert client.callback_complete(second.callback_token, {"ok": 2}).result == "completed"
    assert client.wait(job.id, timeout=STUCK).status == "succeeded"
    with pytest.raises(ProblemError) as stale_report:
        client.complete(second.id, second.lease_token, {})
    assert stale_report.value.status == 409
