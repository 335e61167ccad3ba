"""The Worker against a real server, in real worker processes (tests/workers/behaviours.py):
sync and async handlers, check-later, retryable and non-retryable failures, heartbeats with
progress and logs, a kill -9 mid-task, graceful and abandoning shutdowns, callbacks, tokens."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import Server, Workers, free_port, start_server
from support import BIN, STUCK, eventually, one_step

from starbridge import Client, ProblemError


def started(workers: Workers, task_id: str, attempt: int) -> str:
    """Waits until attempt `attempt` of the task started; the id of the worker running it."""
    path = workers.state / f"started-{task_id}-{attempt}"
    eventually(path.exists, f"attempt {attempt} of {task_id} to start")
    return path.read_text()


def release(workers: Workers, task_id: str) -> None:
    (workers.state / f"release-{task_id}").touch()


def test_sync_and_async_handlers_run_alike(client: Client, workers: Workers) -> None:
    client.apply(
        {
            "name": "both",
            "steps": [
                {"id": "sync", "queue": "py", "command": "sync_echo", "input": {"n": "${{ params.n }}"}},
                {"id": "async", "queue": "py", "command": "async_echo", "input": {"sync": "${{ steps.sync.output.echo }}"}},
            ],
        }
    )
    workers.start("behaviours.py", "w1")
    job = client.wait(client.submit("both", {"n": 7}).id, timeout=STUCK)
    assert job.status == "succeeded"
    sync, asynchronous = job.tasks
    # The sync handler ran in a thread of its own, the async one on the worker's event loop.
    assert sync.output == {"echo": {"n": 7}, "thread": True, "by": "w1"}
    assert asynchronous.output == {"echo": {"sync": {"n": 7}}, "loop": True, "by": "w1"}
    assert sync.worker_id == asynchronous.worker_id == "w1"


def test_check_later_continues_the_same_attempt_with_its_progress(client: Client, workers: Workers) -> None:
    one_step(client, "later", "check_later")
    workers.start("behaviours.py", "w1")
    job = client.wait(client.submit("later").id, timeout=STUCK)
    assert job.status == "succeeded"
    [task] = job.tasks
    # Two check-laters used no attempt, kept the idempotency key and gave the progress back.
    assert task.output == {"polls": 3, "attempt": 1, "same_key": True}
    assert [run.outcome for run in task.attempts] == ["check_later", "check_later", "succeeded"]
    assert {run.attempt for run in task.attempts} == {1}


def test_non_retryable_fails_the_step_at_once_while_other_errors_are_retried(client: Client, workers: Workers) -> None:
    retry = {"max_attempts": 3, "initial": "50ms"}
    client.apply(
        {
            "name": "errors",
            "steps": [
                {"id": "flaky", "queue": "py", "command": "flaky", "retry": retry},
                {"id": "fatal", "queue": "py", "command": "non_retryable", "retry": retry},
            ],
        }
    )
    workers.start("behaviours.py", "w1")
    job = client.wait(client.submit("errors").id, timeout=STUCK)
    assert job.status == "failed"
    flaky, fatal = job.tasks
    assert (flaky.status, flaky.attempt) == ("succeeded", 2)
    assert (flaky.attempts[0].outcome, flaky.attempts[0].error) == ("failed", "ValueError: control plane busy")
    assert (fatal.status, fatal.attempt) == ("failed", 1)
    assert fatal.error == {"message": "quota exhausted", "retryable": False, "kind": "handler"}
    assert "NonRetryable: quota exhausted" in fatal.logs.traceback


def test_a_command_without_a_handler_fails_for_good(client: Client, workers: Workers) -> None:
    one_step(client, "unknown", "no_such_command", retry={"max_attempts": 3})
    workers.start("behaviours.py", "w1")
    job = client.wait(client.submit("unknown").id, timeout=STUCK)
    [task] = job.tasks
    assert (job.status, task.attempt, task.error.retryable) == ("failed", 1, False)
    assert task.error.message == "no handler for command no_such_command on queue py in worker w1"


def test_heartbeats_keep_the_lease_and_carry_progress_while_logs_go_with_the_report(
    client: Client, workers: Workers
) -> None:
    # A 2 s lease and a single attempt: without heartbeats the lease would lapse and the job fail.
    one_step(client, "long", "report_progress", timeout="2s")
    workers.start("behaviours.py", "w1")
    job_id = client.submit("long").id
    task_id = client.job(job_id).tasks[0].id
    started(workers, task_id, 1)
    leases: set[str] = set()

    def lease_extended_four_times() -> bool:
        task = client.job(job_id).tasks[0]
        assert (task.status, task.attempt) == ("running", 1), task
        leases.add(task.lease_expires_at)
        return task.progress == {"copied": 10} and len(leases) >= 5

    eventually(lease_extended_four_times, "heartbeats with progress to extend the lease past its first two seconds")
    release(workers, task_id)
    job = client.wait(job_id, timeout=STUCK)
    [task] = job.tasks
    assert (job.status, task.attempt, len(task.attempts)) == ("succeeded", 1, 1)
    assert task.output == {"copied": 20}
    lines = task.logs.log.splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ['copying {"table": "users", "rows": 10}', "done"]


def test_a_task_of_a_killed_worker_is_retried_by_another_once_its_lease_lapses(client: Client, workers: Workers) -> None:
    one_step(client, "killed", "hold", timeout="2s", retry={"max_attempts": 2, "initial": "50ms"})
    first = workers.start("behaviours.py", "first")
    job = client.submit("killed")
    task_id = job.tasks[0].id
    assert started(workers, task_id, 1) == "first"
    first.process.send_signal(signal.SIGKILL)
    assert workers.wait_exit(first) == -signal.SIGKILL
    workers.start("behaviours.py", "second")
    job = client.wait(job.id, timeout=STUCK)
    [task] = job.tasks
    assert job.status == "succeeded"
    assert task.output == {"attempt": 2, "by": "second"}
    assert [(run.worker_id, run.outcome) for run in task.attempts] == [("first", "lease_expired"), ("second", "succeeded")]


def test_reports_are_retried_while_the_server_is_down(client: Client, workers: Workers, server: Server) -> None:
    one_step(client, "outage", "hold")
    worker = workers.start("behaviours.py", "w1")
    job = client.submit("outage")
    task_id = job.tasks[0].id
    started(workers, task_id, 1)
    server.kill()
    release(workers, task_id)
    eventually(lambda: "complete report failed" in worker.output(), "the report to fail while the server is down")
    server.start()
    job = client.wait(job.id, timeout=STUCK)
    # The report got through after the restart: the attempt was not lost, nor run again.
    assert (job.status, job.tasks[0].attempt, job.tasks[0].output) == ("succeeded", 1, {"attempt": 1, "by": "w1"})
    # The worker polls the restarted server too.
    one_step(client, "after", "sync_echo")
    assert client.wait(client.submit("after").id, timeout=STUCK).status == "succeeded"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_lets_a_running_handler_finish_and_be_reported(
    client: Client, workers: Workers, stop: signal.Signals
) -> None:
    one_step(client, "graceful", "until_shutdown")
    worker = workers.start("behaviours.py", "w1")
    job = client.submit("graceful")
    started(workers, job.tasks[0].id, 1)
    worker.process.send_signal(stop)
    assert workers.wait_exit(worker) == 0
    # The report went out before the worker exited.
    job = client.job(job.id)
    assert job.status == "succeeded"
    assert job.tasks[0].output == {"graceful": True, "by": "w1"}
    assert "worker exited cleanly" in worker.output()


@pytest.mark.parametrize("hurry", [False, True], ids=["grace-over", "second-signal"])
def test_a_handler_still_running_after_the_grace_period_is_abandoned_and_retried(
    client: Client, workers: Workers, hurry: bool
) -> None:
    one_step(client, "abandoned", "hold", timeout="2s", retry={"max_attempts": 2, "initial": "50ms"})
    # A second signal ends a grace period longer than the test would wait.
    impatient = workers.start("behaviours.py", "impatient", GRACE="3600" if hurry else "0.2")
    job = client.submit("abandoned")
    started(workers, job.tasks[0].id, 1)
    impatient.process.send_signal(signal.SIGTERM)
    if hurry:
        eventually(lambda: "stopping: no more polls" in impatient.output(), "the worker to start stopping")
        impatient.process.send_signal(signal.SIGINT)
    # The sync handler's thread never returns: the worker exits without it, reporting nothing.
    assert workers.wait_exit(impatient) == 0
    assert "abandoning 1 running tasks" in impatient.output()
    workers.start("behaviours.py", "second")
    job = client.wait(job.id, timeout=STUCK)
    [task] = job.tasks
    assert (job.status, task.output) == ("succeeded", {"attempt": 2, "by": "second"})
    assert [(run.worker_id, run.outcome) for run in task.attempts] == [("impatient", "lease_expired"), ("second", "succeeded")]


def test_await_callback_lets_another_system_finish_the_attempt(client: Client, workers: Workers) -> None:
    one_step(client, "handed_off", "callback")
    workers.start("behaviours.py", "w1")
    job = client.submit("handed_off")
    token_file = workers.state / f"callback-{job.tasks[0].id}"
    eventually(token_file.exists, "the handler to hand out its callback token")
    eventually(lambda: "callback" in (client.job(job.id).tasks[0].waiting_for or {}), "the task to await its callback")
    answer = client.callback_complete(token_file.read_text(), {"done": True})
    assert answer.result == "completed"
    job = client.wait(job.id, timeout=STUCK)
    assert (job.status, job.tasks[0].output) == ("succeeded", {"done": True})
    with pytest.raises(ProblemError) as refused:
        client.callback_fail(token_file.read_text(), "too late")
    assert refused.value.status == 410


def test_a_handler_sees_its_attempts_traceparent_only_while_the_server_traces(
    tmp_path: Path, client: Client, workers: Workers
) -> None:
    one_step(client, "traced", "traceparent")
    workers.start("behaviours.py", "w1")
    untraced = client.wait(client.submit("traced", {}).id, timeout=STUCK)
    assert untraced.tasks[0].output == {"traceparent": None}
    # Nothing listens at the endpoint: spans are lost, the trace context still reaches workers.
    traced_dir = tmp_path / "traced"
    traced_dir.mkdir()
    server: Server = start_server(traced_dir, "--otlp-endpoint", f"http://127.0.0.1:{free_port()}")
    state = traced_dir / "state"
    state.mkdir()
    traced_workers = Workers(server, state)
    try:
        traced_client = Client(server.url)
        one_step(traced_client, "traced", "traceparent")
        traced_workers.start("behaviours.py", "w2")
        job = traced_client.wait(traced_client.submit("traced", {}).id, timeout=STUCK)
        [task] = job.tasks
        assert job.status == "succeeded"
        assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", task.output["traceparent"]), task.output
    finally:
        traced_workers.end_all()
        server.kill()


def test_an_output_over_the_servers_task_size_limit_fails_for_good(tmp_path: Path) -> None:
    # The poll answer carries the server's --max-task-bytes; the worker fails a larger output
    # for good instead of sending a report the server would refuse.
    server: Server = start_server(tmp_path, "--max-task-bytes", "4096")
    state = tmp_path / "state"
    state.mkdir()
    workers = Workers(server, state)
    try:
        client = Client(server.url)
        one_step(client, "big", "large_output", retry={"max_attempts": 3})
        workers.start("behaviours.py", "w1")
        small = client.wait(client.submit("big", {"bytes": 100}).id, timeout=STUCK)
        assert small.status == "succeeded"
        job = client.wait(client.submit("big", {"bytes": 10_000}).id, timeout=STUCK)
        [task] = job.tasks
        assert (job.status, task.attempt, task.error.retryable) == ("failed", 1, False)
        assert "4096" in task.error.message
    finally:
        workers.end_all()
        server.kill()


def test_tokens_bind_the_client_and_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    database = f"sqlite://{tmp_path}/starbridge.db"
    admin_token = subprocess.run(
        [str(BIN), "token", "bootstrap", "--database", database], check=True, capture_output=True, text=True
    ).stdout.strip()
    server: Server = start_server(tmp_path, "--auth")
    state = tmp_path / "state"
    state.mkdir()
    workers = Workers(server, state)
    try:
        with pytest.raises(ProblemError) as unauthorized:
            Client(server.url).workflows()
        assert unauthorized.value.status == 401
        monkeypatch.setenv("STARBRIDGE_TOKEN", admin_token)
        admin = Client(server.url)  # the token from STARBRIDGE_TOKEN
        one_step(admin, "guarded", "sync_echo")
        work = admin.create_token("py-worker", ["work"], queues=["py"]).secret
        with pytest.raises(ProblemError) as forbidden:
            Client(server.url, token=work).submit("guarded")
        assert forbidden.value.status == 403
        workers.start("behaviours.py", "w1", STARBRIDGE_TOKEN=work)
        job = admin.wait(admin.submit("guarded", {"n": 1}).id, timeout=STUCK)
        assert (job.status, job.tasks[0].worker_id) == ("succeeded", "w1")
    finally:
        workers.end_all()
        server.kill()


def requests_answered(metrics: str, labels: str) -> int:
    """The count of `starbridge_http_requests_total` in a `/metrics` text, over every status, of
    the series whose labels hold `labels` (such as `route="/api/v1/tasks/poll"`)."""
    pattern = re.compile(r"^starbridge_http_requests_total\{(.*)\} (\d+)$")
    return sum(
        int(found.group(2))
        for found in map(pattern.match, metrics.splitlines())
        if found is not None and labels in found.group(1)
    )


def test_a_busy_worker_makes_one_request_per_task_each_success_riding_on_the_next_poll(
    client: Client, server: Server, workers: Workers
) -> None:
    steps = [{"id": step, "queue": "py", "command": "async_echo"} for step in ("a", "b", "c")]
    client.apply({"name": "busy", "steps": steps})
    ids = [client.submit("busy").id for _ in range(3)]
    # One slot, so no success finishes while a poll is out; the last poll waits long for work.
    workers.start("behaviours.py", "w1", CONCURRENCY="1", POLL_WAIT="60")
    for job_id in ids:
        assert client.wait(job_id, timeout=STUCK).status == "succeeded"
    metrics = httpx.get(f"{server.url}/metrics").text
    tasks = 3 * 3
    # The last poll carried the last success and now waits for work: it is not answered yet.
    polls = requests_answered(metrics, 'method="POST",route="/api/v1/tasks/poll"')
    assert polls == tasks, metrics
    assert requests_answered(metrics, 'route="/api/v1/tasks/') == polls, "no request but polls"


def test_a_success_finishing_while_a_poll_waits_for_work_rides_a_poll_of_its_own(
    client: Client, server: Server, workers: Workers
) -> None:
    steps = [{"id": step, "queue": "py", "command": "async_echo"} for step in ("a", "b", "c")]
    client.apply({"name": "chain", "steps": steps})
    # Free slots, so a poll waits for work while each step runs: each success starts a poll
    # that does not wait, which reports it and claims the next step in one go.
    workers.start("behaviours.py", "w1", CONCURRENCY="4", POLL_WAIT="60")
    job_id = client.submit("chain").id
    assert client.wait(job_id, timeout=STUCK).status == "succeeded"
    metrics = httpx.get(f"{server.url}/metrics").text
    polls = requests_answered(metrics, 'method="POST",route="/api/v1/tasks/poll"')
    # The first poll took step a; each success then went on a poll of its own (the poll waiting
    # for work is not answered yet).
    assert polls == 1 + len(steps), metrics
    assert requests_answered(metrics, 'route="/api/v1/tasks/') == polls, "a success went on its own"
