"""`Client`: every operation of the Starbridge HTTP API (docs/reference.md, section 4), one
method each, synchronous. Answers are `View`s; lists that page are iterators that follow the
cursor; every non-2xx answer raises `ProblemError`; a request that gets no answer raises the
`httpx.TransportError` it met."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import httpx

from starbridge import _protocol
from starbridge._definitions import Definition, read
from starbridge._http import Call, Connection, ProblemError, decode, post, segment, without_none
from starbridge._views import View

#: The job statuses after which nothing runs unless an operator acts (`Client.wait` ends there).
FINAL_JOB_STATUSES = frozenset({"succeeded", "failed", "compensation_failed", "cancelled", "timed_out"})
#: How long a request may take unless the client is told otherwise (seconds).
DEFAULT_TIMEOUT = 30.0
# The page size `Client.events` asks for by default (the server's), and the most it serves.
_EVENTS_PAGE = 1000
_MAX_EVENTS_PAGE = 10_000
# How often `Client.wait` reads the job: from the first interval, doubling up to the last.
_WAIT_FIRST_INTERVAL = 0.05
_WAIT_MAX_INTERVAL = 1.0


def _time(value: datetime | str | None) -> str | None:
    """A time for the API: RFC 3339 (a `datetime` must carry its offset)."""
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError("a datetime sent to the server needs a time zone (e.g. datetime.now(timezone.utc))")
    return value.isoformat()


def _label_selectors(labels: Mapping[str, str] | None) -> list[tuple[str, str]]:
    return [("label", f"{key}={value}") for key, value in (labels or {}).items()]


class Client:
    """A client of one Starbridge server.

    `server` is the root URL (default: `STARBRIDGE_SERVER`, else `http://127.0.0.1:7433`);
    `token` the API token for a server run with `--auth` (default: `STARBRIDGE_TOKEN`); `actor`
    the `Starbridge-Actor` header (who acts, on a server without `--auth`); `namespace` is sent
    with every request that has one (the server's `default` when `None`). Use it as a context
    manager, or call `close()`, to release its connections.
    """

    def __init__(
        self,
        server: str | None = None,
        *,
        token: str | None = None,
        namespace: str | None = None,
        actor: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.connection = Connection.resolve(server, token, actor, namespace)
        self._http = httpx.Client(timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the client's connections."""
        self._http.close()

    def call(self, call: Call) -> Any:
        """Sends one described call and returns its answer's JSON (for operations a newer server
        has and this SDK does not know yet)."""
        return decode(self._http.send(self.connection.request(self._http, call)))

    def _view(self, call: Call) -> View:
        return View(self.call(call))

    def _list(self, call: Call) -> list[View]:
        return [View(item) for item in self.call(call)["items"]]

    # --- system -------------------------------------------------------------------------------

    def health(self) -> View:
        """`GET /healthz`: `{status, database, detail}`; an unhealthy server raises
        `ProblemError` (503) whose detail says what the answer rests on."""
        return self._view(Call("GET", "/healthz", namespaced=False))

    def metrics(self) -> str:
        """`GET /metrics`: the Prometheus text (scope `admin`)."""
        return str(self.call(Call("GET", "/metrics", namespaced=False)))

    def openapi(self) -> dict[str, Any]:
        """`GET /api/v1/openapi.json`: the OpenAPI document of the server's API."""
        document: dict[str, Any] = self.call(Call("GET", "/api/v1/openapi.json", namespaced=False))
        return document

    # --- workflows ----------------------------------------------------------------------------

    def apply(self, definition: Definition, *, name: str | None = None) -> View:
        """`PUT /api/v1/workflows/{name}`: applies a definition given as a file path, a YAML or
        JSON text, or a dict. The name is `name`, else the one the definition gives (or a
        file's stem). Answers `{namespace, name, version, created}`."""
        document = read(definition, name)
        path = f"/api/v1/workflows/{segment(document.name)}"
        if document.mapping is not None:
            return self._view(Call("PUT", path, body=dict(document.mapping), has_body=True))
        return self._view(Call("PUT", path, text=document.text))

    def workflows(self) -> list[View]:
        """`GET /api/v1/workflows`: the latest version of every workflow, by name."""
        return self._list(Call("GET", "/api/v1/workflows"))

    def workflow(self, name: str, *, version: int | None = None) -> View:
        """`GET /api/v1/workflows/{name}`: a version (the latest by default) with its definition."""
        query = [("version", str(version))] if version is not None else []
        return self._view(Call("GET", f"/api/v1/workflows/{segment(name)}", query))

    def delete_workflow(self, name: str) -> None:
        """`DELETE /api/v1/workflows/{name}`: hides the workflow (its versions stay for the jobs
        that ran them; a later apply continues at the next version). 409 naming what still uses
        it: jobs not succeeded, schedules, other workflows' sub-workflow steps."""
        self.call(Call("DELETE", f"/api/v1/workflows/{segment(name)}"))

    # --- jobs ---------------------------------------------------------------------------------

    def submit(
        self,
        workflow: str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        labels: Mapping[str, str] | None = None,
        version: int | None = None,
        priority: int | None = None,
        definition: Mapping[str, Any] | None = None,
    ) -> View:
        """`POST /api/v1/jobs`: starts a job of `workflow` (or of an inline `definition`) and
        returns its view. With a `key` already used in the namespace, returns that job instead."""
        body = without_none(
            workflow=workflow,
            params=dict(params) if params is not None else None,
            key=key,
            labels=dict(labels) if labels is not None else None,
            version=version,
            priority=priority,
            definition=dict(definition) if definition is not None else None,
        )
        return self._view(post("/api/v1/jobs", body))

    def submit_batch(self, jobs: Iterable[Mapping[str, Any]]) -> list[View | ProblemError]:
        """`POST /api/v1/jobs/batch`: up to 1000 submissions (each a body of `POST
        /api/v1/jobs`: `{workflow, params, key, …}`) in one request. One entry per job, in
        order: `{id, status, created}`, or the `ProblemError` (returned, not raised) that
        refused it."""
        answer = self.call(post("/api/v1/jobs/batch", {"jobs": [dict(job) for job in jobs]}))
        return _protocol.batch_items(answer)

    def job(self, job_id: str) -> View:
        """`GET /api/v1/jobs/{id}`: the job with its params, output and tasks."""
        return self._view(Call("GET", f"/api/v1/jobs/{segment(job_id)}"))

    def jobs_page(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        parent: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> View:
        """`GET /api/v1/jobs`: one page of jobs, newest first, `{items, next_cursor}` (`None`
        on the last page). `labels` selects the jobs with every one of them."""
        query = [
            (name, str(value))
            for name, value in without_none(
                status=status,
                workflow=workflow,
                created_after=_time(created_after),
                created_before=_time(created_before),
                parent=parent,
                limit=limit,
                cursor=cursor,
            ).items()
        ]
        query += _label_selectors(labels)
        return self._view(Call("GET", "/api/v1/jobs", query))

    def jobs(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        parent: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[View]:
        """Every job the filters select, newest first, page after page (`page_size` jobs a
        request; the server's default when `None`) as the iteration goes."""
        cursor: str | None = None
        while True:
            page = self.jobs_page(
                status=status,
                workflow=workflow,
                labels=labels,
                created_after=created_after,
                created_before=created_before,
                parent=parent,
                limit=page_size,
                cursor=cursor,
            )
            yield from page.items
            cursor = page.next_cursor
            if not cursor:
                return

    def events(self, job_id: str, *, after: int = 0, page_size: int = _EVENTS_PAGE) -> Iterator[View]:
        """`GET /api/v1/jobs/{id}/events`: the job's history from after event `after`, oldest
        first, page after page."""
        page_size = min(max(page_size, 1), _MAX_EVENTS_PAGE)  # as the server clamps it
        while True:
            query = [("after", str(after)), ("limit", str(page_size))]
            page = self._list(Call("GET", f"/api/v1/jobs/{segment(job_id)}/events", query))
            yield from page
            if len(page) < page_size:
                return
            after = page[-1].seq

    def wait(self, job_id: str, *, timeout: float = 600.0) -> View:
        """Reads the job until it is final (succeeded, failed, compensation_failed, cancelled,
        timed_out) and returns that view; `TimeoutError` when it is not after `timeout`
        seconds."""
        deadline = time.monotonic() + timeout
        interval = _WAIT_FIRST_INTERVAL
        while True:
            job = self.job(job_id)
            if job.status in FINAL_JOB_STATUSES:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout} s")
            time.sleep(min(interval, left))
            interval = min(interval * 2, _WAIT_MAX_INTERVAL)

    # --- operator actions ---------------------------------------------------------------------

    def _action(self, job_id: str, action: str, body: Mapping[str, Any]) -> View:
        return self._view(post(f"/api/v1/jobs/{segment(job_id)}/{action}", dict(body)))

    def pause(self, job_id: str, *, reason: str | None = None) -> View:
        """Nothing new of the job is dispatched; running tasks finish."""
        return self._action(job_id, "pause", without_none(reason=reason))

    def resume(self, job_id: str, *, reason: str | None = None) -> View:
        """A paused job's held tasks are claimable again."""
        return self._action(job_id, "resume", without_none(reason=reason))

    def cancel(self, job_id: str, *, reason: str | None = None, compensate: bool = False) -> View:
        """Ends the job `cancelled`, first undoing its finished steps when `compensate`."""
        return self._action(job_id, "cancel", without_none(reason=reason, compensate=compensate))

    def delete_job(self, job_id: str) -> None:
        """`DELETE /api/v1/jobs/{id}`: a finished job goes with its tasks and history, and its
        key is free again (an unfinished job, or a child whose parent is kept: 409)."""
        self.call(Call("DELETE", f"/api/v1/jobs/{segment(job_id)}"))

    def retry(self, job_id: str, *, reason: str | None = None) -> View:
        """A new round of a final job: its failed, cancelled and undone tasks run again."""
        return self._action(job_id, "retry", without_none(reason=reason))

    def rerun(self, job_id: str, step: str, *, reason: str | None = None) -> View:
        """A new round of a final job: `step` and everything downstream of it run again."""
        return self._action(job_id, "rerun", without_none(step=step, reason=reason))

    def skip(self, job_id: str, task: str, *, output: Any = None, reason: str | None = None) -> View:
        """Marks a task succeeded by hand with `output`. `task` is a task id (`tsk_…`) or the id
        of a step that has one task the action applies to."""
        task_id = self._task_of(job_id, task, lambda view: view.kind != "fan_out")
        body = without_none(reason=reason)
        body["output"] = output
        return self._view(post(f"/api/v1/jobs/{segment(job_id)}/tasks/{segment(task_id)}/skip", body))

    def bulk(
        self,
        action: str,
        *,
        workflow: str | None = None,
        status: str | None = None,
        labels: Mapping[str, str] | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        ids: Sequence[str] | None = None,
        reason: str | None = None,
        compensate: bool = False,
        step: str | None = None,
        output: Any = None,
        dry_run: bool = False,
        limit: int | None = None,
    ) -> View:
        """`POST /api/v1/jobs/bulk/{action}` (`pause`, `resume`, `cancel`, `retry`, `skip`,
        `rerun` or `delete`) on every job the filters select (at most `limit`, newest first):
        `{matched, affected, refused}`. `skip` and `rerun` need `step` (`skip` sets the step's
        output to `output`); `ids` selects those jobs only; `dry_run` only counts them."""
        body = without_none(
            workflow=workflow,
            status=status,
            labels=dict(labels) if labels else None,
            created_after=_time(created_after),
            created_before=_time(created_before),
            ids=list(ids) if ids is not None else None,
            reason=reason,
            compensate=compensate,
            step=step,
            output=output,
            dry_run=dry_run,
            limit=limit,
        )
        return self._view(post(f"/api/v1/jobs/bulk/{segment(action)}", body))

    # --- signals, approvals, callbacks --------------------------------------------------------

    def signal(self, job_id: str, name: str, payload: Any = None, *, id: str | None = None) -> View:
        """Sends signal `name` with `payload` to the job; `id` deduplicates repeated sends.
        Answers `{job_id, name, id, duplicate, taken}`."""
        body = without_none(payload=payload, id=id)
        return self._view(post(f"/api/v1/jobs/{segment(job_id)}/signals/{segment(name)}", body))

    def approvals(self, *, limit: int | None = None) -> list[View]:
        """The tasks waiting for approval, oldest first."""
        query = [("limit", str(limit))] if limit is not None else []
        return self._list(Call("GET", "/api/v1/approvals", query))

    def approve(self, job_id: str, task: str, *, comment: str | None = None) -> View:
        """Approves an approval step: `task` is its task id or its step id."""
        return self._decide(job_id, task, "approve", comment)

    def reject(self, job_id: str, task: str, *, comment: str | None = None) -> View:
        """Rejects an approval step (it fails for good): `task` is its task id or step id."""
        return self._decide(job_id, task, "reject", comment)

    def _decide(self, job_id: str, task: str, decision: str, comment: str | None) -> View:
        task_id = self._task_of(job_id, task, lambda view: "approval" in (view.get("waiting_for") or {}))
        body = without_none(comment=comment)
        return self._view(post(f"/api/v1/jobs/{segment(job_id)}/tasks/{segment(task_id)}/{decision}", body))

    def _task_of(self, job_id: str, task: str, applies: Callable[[View], bool]) -> str:
        """`task` when it is a task id; else the id of the one task of step `task` that the
        action `applies` to (a `ValueError` when there is none or several)."""
        if task.startswith("tsk_"):
            return task
        tasks = [view for view in self.job(job_id).tasks if view.step == task and view.kind != "compensation"]
        candidates = [view for view in tasks if applies(view)] or tasks
        if len(candidates) != 1:
            found = ", ".join(f"{view.id} ({view.status})" for view in candidates) or "none"
            raise ValueError(f"step {task!r} of job {job_id} has no single task to act on ({found}): pass a task id")
        task_id: str = candidates[0].id
        return task_id

    def callback_complete(self, token: str, output: Any = None) -> View:
        """Finishes an attempt that awaits a callback, through its callback token (no API
        token needed): `{job_id, task_id, result}`."""
        return self._callback(token, "complete", {"output": output})

    def callback_fail(self, token: str, message: str, *, retryable: bool = True) -> View:
        """Fails an attempt that awaits a callback, through its callback token."""
        return self._callback(token, "fail", {"error": {"message": message, "retryable": retryable}})

    def callback_heartbeat(self, token: str) -> View:
        """Moves the end of a callback wait to now plus its timeout."""
        return self._callback(token, "heartbeat", {})

    def _callback(self, token: str, call: str, body: Mapping[str, Any]) -> View:
        return self._view(post(f"/api/v1/callbacks/{segment(token)}/{call}", dict(body), namespaced=False))

    # --- queues -------------------------------------------------------------------------------

    def queues(self) -> list[View]:
        """Every queue of the namespace with its settings and depth, by name."""
        return self._list(Call("GET", "/api/v1/queues"))

    def queue(self, name: str) -> View:
        """One queue with its settings and depth."""
        return self._view(Call("GET", f"/api/v1/queues/{segment(name)}"))

    def configure_queue(self, name: str, **settings: Any) -> View:
        """`PUT /api/v1/queues/{name}`: changes the settings given (`mode`, `priority`,
        `concurrency`, `max_wait`, `rate`, `on_error`) and leaves the others; `concurrency=None`
        or `rate=None` removes that limit; `on_error="pause"` stops the queue when a task on it
        fails for good (its `paused_reason` says why)."""
        return self._view(Call("PUT", f"/api/v1/queues/{segment(name)}", body=settings, has_body=True))

    def pause_queue(self, name: str) -> View:
        """The queue hands out no task until resumed."""
        return self._view(Call("POST", f"/api/v1/queues/{segment(name)}/pause"))

    def resume_queue(self, name: str) -> View:
        """The queue hands out tasks again."""
        return self._view(Call("POST", f"/api/v1/queues/{segment(name)}/resume"))

    # --- schedules ----------------------------------------------------------------------------

    def schedules(self) -> list[View]:
        """Every schedule of the namespace, by name."""
        return self._list(Call("GET", "/api/v1/schedules"))

    def schedule(self, name: str) -> View:
        """One schedule with its next fires and what its last fire did."""
        return self._view(Call("GET", f"/api/v1/schedules/{segment(name)}"))

    def put_schedule(
        self,
        name: str,
        workflow: str,
        cron: str,
        *,
        params: Mapping[str, Any] | None = None,
        timezone: str | None = None,
        overlap: str | None = None,
        catch_up: Mapping[str, Any] | None = None,
        paused: bool = False,
        labels: Mapping[str, str] | None = None,
    ) -> View:
        """`PUT /api/v1/schedules/{name}`: creates the schedule or replaces every setting of it
        (a setting not given takes its default)."""
        body = without_none(
            workflow=workflow,
            cron=cron,
            params=dict(params) if params is not None else None,
            timezone=timezone,
            overlap=overlap,
            catch_up=dict(catch_up) if catch_up is not None else None,
            paused=paused,
            labels=dict(labels) if labels is not None else None,
        )
        return self._view(Call("PUT", f"/api/v1/schedules/{segment(name)}", body=body, has_body=True))

    def delete_schedule(self, name: str) -> None:
        """The schedule fires no more; the jobs it started are not affected."""
        self.call(Call("DELETE", f"/api/v1/schedules/{segment(name)}"))

    def pause_schedule(self, name: str) -> View:
        """The schedule fires no more until resumed."""
        return self._view(Call("POST", f"/api/v1/schedules/{segment(name)}/pause"))

    def resume_schedule(self, name: str) -> View:
        """The schedule fires again from its next occurrence."""
        return self._view(Call("POST", f"/api/v1/schedules/{segment(name)}/resume"))

    # --- webhooks -----------------------------------------------------------------------------

    def webhooks(self) -> list[View]:
        """Every webhook subscription of the namespace, oldest first."""
        return self._list(Call("GET", "/api/v1/webhooks"))

    def add_webhook(
        self,
        url: str,
        *,
        workflow: str | None = None,
        states: Sequence[str] | None = None,
        events: Sequence[str] | None = None,
        steps: Sequence[str] | None = None,
        secret: str | None = None,
    ) -> View:
        """Subscribes `url` to `events` (default `["job.status_changed"]`; also `task.started`,
        `task.succeeded`, `task.failed`, `task.retrying`) of jobs of `workflow`: job status
        changes to `states`, task events of `steps` (every step when absent). The answer carries
        the signing `secret`, shown this once."""
        body = without_none(
            url=url,
            workflow=workflow,
            states=list(states) if states is not None else None,
            events=list(events) if events is not None else None,
            steps=list(steps) if steps is not None else None,
            secret=secret,
        )
        return self._view(post("/api/v1/webhooks", body))

    def delete_webhook(self, webhook_id: str) -> None:
        """Unsubscribes; undelivered messages are dropped."""
        self.call(Call("DELETE", f"/api/v1/webhooks/{segment(webhook_id)}"))

    def deliveries(self, webhook_id: str, *, limit: int | None = None) -> list[View]:
        """A subscription's recent deliveries, newest first (at most `limit`)."""
        query = [("limit", str(limit))] if limit is not None else []
        return self._list(Call("GET", f"/api/v1/webhooks/{segment(webhook_id)}/deliveries", query))

    # --- tokens and audit ---------------------------------------------------------------------

    def tokens(self) -> list[View]:
        """Every API token, revoked ones included, oldest first (scope `admin`)."""
        return self._list(Call("GET", "/api/v1/tokens", namespaced=False))

    def create_token(
        self,
        name: str,
        scopes: Sequence[str],
        *,
        namespace: str | None = None,
        queues: Sequence[str] | None = None,
        reason: str | None = None,
    ) -> View:
        """Creates an API token: `{token, secret}`, the secret (`sbt_…`) shown this once."""
        body = without_none(
            name=name,
            scopes=list(scopes),
            namespace=namespace,
            queues=list(queues) if queues is not None else None,
            reason=reason,
        )
        return self._view(post("/api/v1/tokens", body, namespaced=False))

    def revoke_token(self, token_id: str) -> View:
        """Revokes a token (its 16-hex-character id) and returns its view."""
        return self._view(Call("DELETE", f"/api/v1/tokens/{segment(token_id)}", namespaced=False))

    def audit(self, *, page_size: int | None = None) -> Iterator[View]:
        """The audit log, newest first, page after page: of the client's namespace, or of every
        namespace when the client names none (scope `operate`)."""
        before: int | None = None
        while True:
            query = [
                (name, str(value)) for name, value in without_none(before=before, limit=page_size).items()
            ]
            page = self._view(Call("GET", "/api/v1/audit", query))
            yield from page.items
            before = page.next_cursor
            if before is None:
                return

    # --- the worker protocol ------------------------------------------------------------------

    def poll(
        self,
        queues: Sequence[str],
        *,
        worker_id: str,
        max_tasks: int = 1,
        wait: float = 0.0,
    ) -> list[View]:
        """Claims up to `max_tasks` ready tasks of `queues`, waiting up to `wait` seconds (a
        `Worker` does this for you)."""
        call = _protocol.poll(
            queues, worker_id=worker_id, max_tasks=max_tasks, wait=wait, namespace=self.connection.namespace
        )
        return [View(task) for task in self.call(call)["tasks"]]

    def heartbeat(self, task_id: str, lease_token: str, *, progress: Any = None) -> View:
        """Extends a task's lease, recording `progress`: `{lease_expires_at}`."""
        return self._view(_protocol.heartbeat(task_id, lease_token, progress))

    def complete(self, task_id: str, lease_token: str, output: Any = None, *, logs: Any = None) -> View:
        """Reports a successful attempt: `{task_status, job_status}`."""
        return self._view(_protocol.complete(task_id, lease_token, output, logs))

    def complete_many(self, items: Iterable[Mapping[str, Any]]) -> list[View | ProblemError]:
        """Reports many successes (`{id, lease_token, output, logs}` each) in one request; one
        entry per item: its answer, or the `ProblemError` that refused it."""
        return _protocol.batch_items(self.call(_protocol.complete_many(items)))

    def fail(
        self, task_id: str, lease_token: str, message: str, *, retryable: bool = True, logs: Any = None
    ) -> View:
        """Reports a failed attempt; `retryable=False` fails the step for good."""
        return self._view(_protocol.fail(task_id, lease_token, message, retryable=retryable, logs=logs))

    def check_later(
        self, task_id: str, lease_token: str, after: float | timedelta, *, progress: Any = None
    ) -> View:
        """Reports "not done yet": the task is handed out again `after` (seconds or a
        `timedelta`), continuing the same attempt, with `progress`."""
        return self._view(_protocol.check_later(task_id, lease_token, after, progress))

    def await_callback(
        self, task_id: str, lease_token: str, *, timeout: float | timedelta | None = None
    ) -> View:
        """Lets go of a task that another system finishes through its callback token."""
        return self._view(_protocol.await_callback(task_id, lease_token, timeout))

