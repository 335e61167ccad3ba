"""`Worker`: polls queues for tasks, runs each with its registered handler (sync handlers in
threads, async ones on the event loop) under a concurrency bound, keeps its lease alive with
heartbeats, reports the outcome (retrying while the server is unreachable) and shuts down
gracefully. The semantics are those of the Rust worker (crates/worker/src/worker.rs); they are
listed on `Worker`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import signal
import socket
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

import httpx

from starbridge import _protocol
from starbridge._http import Call, Connection, ProblemError, decode, dumps
from starbridge._outcomes import AwaitCallback, CheckLater, NonRetryable
from starbridge._task import Flag, Task
from starbridge._views import View

#: How many handlers run at once unless configured.
DEFAULT_CONCURRENCY = 4
#: How long a poll may be held by the server when no task is ready (seconds).
DEFAULT_POLL_WAIT = 20.0
#: How long a stopping worker waits for running handlers before abandoning them (seconds).
DEFAULT_SHUTDOWN_GRACE = 30.0
#: First delay before retrying a failed poll or report (seconds).
DEFAULT_RETRY_INITIAL = 0.1
#: Longest delay between retries of a failed poll or report (seconds).
DEFAULT_RETRY_MAX = 5.0
#: How long a report may take (seconds).
REQUEST_TIMEOUT = 30.0
# The most tasks the server hands out per poll; a worker with more free slots asks for this many.
_MAX_TASKS_PER_POLL = 256
# The shortest interval between heartbeats of a task (seconds).
_MIN_HEARTBEAT_INTERVAL = 0.1
# The longest interval between heartbeats of a task (seconds), whatever its lease: an operator's
# stop (a requeue, a fail by hand) reaches the handler within it.
_MAX_HEARTBEAT_INTERVAL = 10.0
# The longest failure message reported (its start is kept).
_MAX_MESSAGE_CHARS = 8192
# Answers to a report or heartbeat meaning the task is no longer this worker's: unknown (404),
# a stale lease (409), an attempt that has ended (410).
_NOT_OURS = frozenset({404, 409, 410})

log = logging.getLogger("starbridge.worker")

Handler = Callable[[Task], Any]
H = TypeVar("H", bound=Handler)
T = TypeVar("T")


def heartbeat_interval(lease: float) -> float:
    """How often a task on a lease of `lease` seconds is heartbeated: a third of the lease, within
    100 ms and 10 s."""
    return min(max(lease / 3, _MIN_HEARTBEAT_INTERVAL), _MAX_HEARTBEAT_INTERVAL)


class Backoff:
    """Capped exponential backoff with jitter: each delay is between half and all of the nominal
    one, which starts at `initial` and doubles up to `maximum`."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = max(maximum, initial)
        self._current = initial

    def next_delay(self) -> float:
        nominal = self._current
        self._current = min(self._current * 2, self._maximum)
        return nominal * (0.5 + random.random() / 2)

    def reset(self) -> None:
        self._current = self._initial


@dataclass(frozen=True)
class Report:
    """A report ready to send: its kind (for logs), its call, and for a success the item a
    batched completion carries instead."""

    kind: str
    call: Call
    batch_item: dict[str, Any] | None = None


def _shorten(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "…"


def _failure(task: Task, message: str, *, retryable: bool, trace: str | None = None) -> Report:
    call = _protocol.fail(
        task.id, task.leased.lease_token, _shorten(message), retryable=retryable, logs=task.logs(trace)
    )
    return Report("fail", call)


def output_refusal(output: Any, max_output_bytes: int | None) -> str | None:
    """Why `output` cannot be reported (not JSON, or larger as JSON than `max_output_bytes`),
    or `None` when it can."""
    try:
        size = len(dumps(output))
    except (TypeError, ValueError) as error:
        return f"the handler's output is not JSON: {error}"
    if max_output_bytes is not None and size > max_output_bytes:
        return (
            f"the handler's output is {size} bytes as JSON, more than the {max_output_bytes} bytes "
            "the server accepts (max_output_bytes): return less, or store the data elsewhere and "
            "return a reference to it"
        )
    return None


def report_for(task: Task, returned: Any, raised: BaseException | None, max_output_bytes: int | None) -> Report:
    """The report of an attempt whose handler returned `returned` or raised `raised`.

    `NonRetryable` fails the step for good; any other exception is a retryable failure (its
    traceback goes with the logs); `CheckLater` and `AwaitCallback` are reported as such; any
    other value is the output, unless it is not JSON or is over `max_output_bytes`, which fails
    the step for good (sending it again would not help)."""
    token = task.leased.lease_token
    if raised is not None:
        trace = "".join(traceback.format_exception(type(raised), raised, raised.__traceback__))
        if isinstance(raised, NonRetryable):
            return _failure(task, str(raised) or "NonRetryable", retryable=False, trace=trace)
        message = f"{type(raised).__name__}: {raised}" if str(raised) else type(raised).__name__
        return _failure(task, message, retryable=True, trace=trace)
    try:
        if isinstance(returned, CheckLater):
            progress = returned.progress
            if progress is None:
                progress = task.current_progress()[1]
            report = Report("check-later", _protocol.check_later(task.id, token, returned.after, progress))
        elif isinstance(returned, AwaitCallback):
            report = Report("await-callback", _protocol.await_callback(task.id, token, returned.timeout))
        else:
            refusal = output_refusal(returned, max_output_bytes)
            if refusal is not None:
                return _failure(task, refusal, retryable=False)
            logs = task.logs()
            report = Report(
                "complete",
                _protocol.complete(task.id, token, returned, logs),
                _protocol.complete_item(task.id, token, returned, logs),
            )
        dumps(report.call.body)
    except (TypeError, ValueError) as error:
        return _failure(task, f"the handler's {type(returned).__name__} cannot be reported: {error}", retryable=False)
    return report


class _Transport:
    """Sends calls with the worker's asynchronous HTTP client."""

    def __init__(self, connection: Connection, http: httpx.AsyncClient) -> None:
        self._connection = connection
        self._http = http

    async def send(self, call: Call) -> Any:
        return decode(await self._http.send(self._connection.request(self._http, call)))


# How long after a poll was sent a success that finished meanwhile still waits to ride on the
# next poll (seconds), when the poll out follows an answer that found a backlog: such a poll
# answers well within it.
CARRY_WAIT = 0.02
# What a poll gives back for a success it did not answer for: it is sent on its own.
_BACK: Any = object()
# How a poll ended (`_Run.poll`), besides failing.
_ANSWERED = "answered"
_AGAIN = "again"
_STOPPED = "stopped"


def refuses_complete(error: ProblemError) -> bool:
    """Whether a refused poll was refused for its `complete` field as such: a server that
    predates it names it as unknown (`body`: "unknown field `complete`"), or names `complete`
    itself. (A problem naming one item, `complete[2].lease_token`, is that item's.)"""
    return error.status in (400, 422) and any(
        fault.field == "complete" or (fault.field == "body" and "unknown field `complete`" in fault.message)
        for fault in error.errors
    )


_Carried = list[tuple[dict[str, Any], "asyncio.Future[Any]"]]


@dataclass
class _Carrying:
    """The successes a poll carries, each answered once the poll is."""

    items: _Carried
    #: The poll is the promising one (see `_Completions`).
    promising: bool
    sent: float

    def tasks(self) -> list[dict[str, Any]]:
        return [item for item, _ in self.items]


def _settle(waiting: asyncio.Future[Any], result: View | ProblemError) -> None:
    """Answers a waiting success with its result, or with the problem that refused it."""
    if waiting.done():
        return
    if isinstance(result, ProblemError):
        waiting.set_exception(result)
    else:
        waiting.set_result(result)


class _Completions:
    """How successes are reported: carried by a poll (`complete` of `POST /api/v1/tasks/poll`),
    so that a busy worker makes one request per cycle, or on their own.

    A success frees its task's slot. With no poll out, the poll loop, which waits for a free
    slot, polls at once (after a backlog, once the other tasks that are ending have ended: see
    `_Slots.take_all`) and carries every success waiting. While a poll is out that is expected
    to answer soon (the answer before it came quickly with every task it asked for, the queue
    had a backlog, and it is younger than `CARRY_WAIT`), the success waits for the next poll.
    Otherwise the poll out is most likely waiting for work, and the success asks for a poll of
    its own that does not wait (`want_poll`): its report and the claim of the work it makes
    ready (its job's next step) then commit together, and the successes that finish while that
    poll is out go together on the next one. A poll that fails hands its successes, and those
    waiting for a poll, back to be sent on their own (sent again, a success the poll did commit
    is answered as the first time, under the same lease token). A server that refuses the
    `complete` field (one that predates it) is not asked again.

    On their own, successes go one request each, or with `batch_completions` in batches: those
    that finish while a batch request is in flight wait for it to end and then go together in
    one `POST /api/v1/tasks/complete`. Either way each success gets its own answer (its result
    or its problem), so the worker handles it exactly as a single report (as the Rust worker's
    crates/worker/src/completions.rs)."""

    def __init__(self, transport: _Transport, *, batch: bool, want_poll: Callable[[], None]) -> None:
        self._transport = transport
        self._batch = batch
        self._want_poll = want_poll
        self._loop = asyncio.get_running_loop()
        self._for_poll: _Carried = []
        # Polls out; when the one expected to answer soon was sent; whether the last answer
        # came quickly with every task asked for; backing off or stopped (no poll soon).
        self._in_flight = 0
        self._promising: float | None = None
        self._found_enough = False
        self._away = False
        self._carry = True
        self._waiting: list[tuple[dict[str, Any], asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def complete(self, report: Report, release_slot: Callable[[], None]) -> Any:
        """Reports one success, on a poll when one is coming soon (then `release_slot` gives up
        the task's slot so that a poll is sent), else on its own; returns its own answer, or
        raises its own problem."""
        item = report.batch_item
        assert item is not None, "a success carries its batch item"
        if self._carry and not self._away:
            now = self._loop.time()
            future: asyncio.Future[Any] = self._loop.create_future()
            entry = (item, future)
            self._for_poll.append(entry)
            release_slot()
            if self._in_flight == 0:
                # The freed slot starts the loop's next poll, which takes it (or hands it back).
                carried = await future
            elif self._promising is not None and self._promising + CARRY_WAIT > now:
                until = self._promising + CARRY_WAIT
                try:
                    carried = await asyncio.wait_for(asyncio.shield(future), until - now)
                except asyncio.TimeoutError:
                    if entry in self._for_poll:
                        # Not taken by a poll in time: take it back.
                        self._for_poll.remove(entry)
                        future.cancel()
                        carried = _BACK
                    else:
                        carried = await future
            else:
                self._want_poll()
                carried = await future
            if carried is not _BACK:
                return carried
        return await self._send_alone(report)

    def waiting_for_poll(self) -> bool:
        """Whether a success waits for a poll to carry it."""
        return bool(self._for_poll)

    def poll_sent(self, *, alone: bool) -> _Carrying:
        """The successes for the poll about to be sent (at most `MAX_BATCH_ITEMS`); `alone`: no
        other poll is out."""
        now = self._loop.time()
        self._in_flight += 1
        promising = alone and self._found_enough
        if promising:
            self._promising = now
        items = self._for_poll[: _protocol.MAX_BATCH_ITEMS]
        del self._for_poll[: len(items)]
        return _Carrying(items, promising, now)

    def _poll_ended(self, carrying: _Carrying) -> None:
        self._in_flight -= 1
        if carrying.promising:
            self._promising = None

    def backlog_found(self) -> bool:
        """Whether the last poll answered quickly with every task it asked for: the queue has a
        backlog, and the next poll is expected to find work at once."""
        return self._found_enough

    def poll_answered(self, carrying: _Carrying, answer: Any, *, backlog: bool) -> None:
        """A poll was answered (`backlog`: with every task it asked for): answers the successes
        it carried with its `reports`."""
        self._poll_ended(carrying)
        # A poll that waited for work until it was woken found the queue empty first.
        self._found_enough = backlog and self._loop.time() - carrying.sent < CARRY_WAIT
        try:
            reports = _protocol.poll_reports(answer)
        except (ValueError, KeyError, TypeError, AttributeError):
            reports = []
        if len(reports) != len(carrying.items):
            # Not the answer of a server that took them: each is sent again on its own.
            self._hand_back(carrying.items)
            return
        for (_, future), report in zip(carrying.items, reports):
            _settle(future, report)

    def poll_failed(self, carrying: _Carrying, error: Exception, *, backing_off: bool) -> bool:
        """Hands the successes of a failed poll, and those waiting for a poll, back to be sent on
        their own; with `backing_off`, no poll comes until `polling_again`. True when the server
        refused to take successes with a poll at all (it predates them): then none is carried
        again, and the poll may be sent again at once."""
        self._poll_ended(carrying)
        predates = bool(carrying.items) and isinstance(error, ProblemError) and refuses_complete(error)
        if backing_off and not predates:
            self._away = True
        if predates and self._carry:
            self._carry = False
            log.info("the server does not take completions with a poll; reporting them on their own")
        waiting, self._for_poll = self._for_poll, []
        self._hand_back(carrying.items + waiting)
        return predates

    def poll_cut_off(self, carrying: _Carrying) -> None:
        """A poll was cut off by the worker stopping: its successes are sent on their own."""
        self._poll_ended(carrying)
        self._hand_back(carrying.items)

    def polling_again(self) -> None:
        """The poll loop polls again (after backing off)."""
        self._away = False

    def polling_stopped(self) -> None:
        """The poll loop stopped: every success goes on its own from now on."""
        self._away = True
        waiting, self._for_poll = self._for_poll, []
        self._hand_back(waiting)

    @staticmethod
    def _hand_back(carried: _Carried) -> None:
        for _, future in carried:
            if not future.done():
                future.set_result(_BACK)

    async def _send_alone(self, report: Report) -> Any:
        if not self._batch:
            return await self._transport.send(report.call)
        answer: asyncio.Future[Any] = self._loop.create_future()
        assert report.batch_item is not None, "a success carries its batch item"
        self._waiting.append((report.batch_item, answer))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all())
        return await answer

    async def _send_all(self) -> None:
        while self._waiting:
            batch = self._waiting[: _protocol.MAX_BATCH_ITEMS]
            del self._waiting[: len(batch)]
            try:
                answer = await self._transport.send(_protocol.complete_many(item for item, _ in batch))
                results = _protocol.batch_items(answer)
                if len(results) != len(batch):
                    raise ProblemError(
                        {"status": 502, "title": "Bad Gateway", "detail": f"the server answered {len(results)} items for {len(batch)} reports"}
                    )
            except (ProblemError, httpx.RequestError) as error:
                # Every report of the batch shares the failure; each report retries on its own
                # (one that did commit is then answered as the first time).
                for _, waiting in batch:
                    if not waiting.done():
                        waiting.set_exception(error)
                continue
            except (ValueError, KeyError, TypeError) as error:
                unreadable = ProblemError({"status": 502, "title": "Bad Gateway", "detail": f"unreadable batch answer: {error}"})
                for _, waiting in batch:
                    if not waiting.done():
                        waiting.set_exception(unreadable)
                continue
            for (_, waiting), result in zip(batch, results):
                _settle(waiting, result)

    def stop(self) -> None:
        """Cancels a batch still being sent once no report waits for it any more."""
        if self._sender is not None:
            self._sender.cancel()


class _Slot:
    """One task's concurrency slot: given back once, when its success is handed to a poll or
    when its supervisor ends."""

    def __init__(self, slots: _Slots) -> None:
        self._slots = slots
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.give()


# How many times in a row the poll loop yields to the event loop without a slot coming free
# before it polls with the slots it has (see `_Slots.take_all`).
_QUIET_YIELDS = 3


class _Slots:
    """The worker's free concurrency slots."""

    def __init__(self, total: int) -> None:
        self._total = total
        self._free = total
        self._freed = asyncio.Event()

    async def take_all(self, *, settle: bool = False) -> int:
        """Waits for a free slot, then takes every free one.

        With `settle` (the queue has a backlog), first lets the other tasks that are ending end:
        the handlers of one answer often end together, and a poll sent at the first free slot
        would carry the first few successes and ask for that many tasks. So while yielding to
        the event loop frees more slots it yields again, until every slot is free or after
        `_QUIET_YIELDS` yields that freed none (no timer, no wait for a handler at work)."""
        while True:
            while self._free == 0:
                self._freed.clear()
                await self._freed.wait()
            quiet = 0
            while settle and self._free < self._total and quiet <= _QUIET_YIELDS:
                before = self._free
                await asyncio.sleep(0)
                quiet = quiet + 1 if self._free == before else 0
            taken = self.take_free()
            if taken:
                return taken

    def take_free(self) -> int:
        """Takes every free slot (perhaps none)."""
        taken, self._free = self._free, 0
        return taken

    def give(self, count: int = 1) -> None:
        if count:
            self._free += count
            self._freed.set()


def is_coroutine_function(handler: Handler) -> bool:
    """True for an async function, and for an object whose `__call__` is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))


def _in_thread(handler: Handler, task: Task) -> asyncio.Future[Any]:
    """Runs a sync handler in a daemon thread of its own (so that an abandoned one does not keep
    the process alive); the future resolves with what it returned or raised."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(returned: Any, raised: BaseException | None) -> None:
        if future.done():
            return
        if raised is None:
            future.set_result(returned)
        else:
            future.set_exception(raised)

    def target() -> None:
        try:
            returned, raised = handler(task), None
        except BaseException as error:  # noqa: BLE001 - reported as the attempt's failure
            returned, raised = None, error
        try:
            loop.call_soon_threadsafe(settle, returned, raised)
        except RuntimeError:
            pass  # The worker has stopped: the attempt was abandoned.

    threading.Thread(target=target, name=f"starbridge {task.id}", daemon=True).start()
    return future


class Worker:
    """Polls queues for tasks and runs them with the handlers registered with `@handler`.

    `server` is the root URL (default: `STARBRIDGE_SERVER`, else `http://127.0.0.1:7433`);
    `token` an API token with the `work` scope for a server run with `--auth` (default:
    `STARBRIDGE_TOKEN`); `queues` the queues to poll (default: those handlers are registered
    for); `worker_id` the id shown on the tasks it runs (default `<hostname>-<pid>`).

    Delivery and shutdown semantics (as the Rust worker's):

    - At most `concurrency` handlers run at once: the worker asks the server only for as many
      tasks as it has free slots, long-polling up to `poll_wait` seconds. Sync handlers run in
      threads, async handlers on the worker's event loop.
    - Each running task is heartbeated every `lease_ms / 3` (at least 100 ms, at most 10 s), carrying the
      progress last set with `Task.progress`. A heartbeat answered `404`, `409` or `410` means
      the server took the task away: `Task.cancelled` turns true, an async handler is
      cancelled, and whatever the handler returns is **not** reported.
    - A report that fails with a transport error or a 5xx is retried with capped exponential
      backoff (`retry_backoff`, default 0.1 s to 5 s) until it is accepted, a 4xx comes back, or
      the lease has surely expired (then the server retries the task). A `404`/`409`/`410`
      report is logged and dropped: the task is no longer this worker's.
    - A success rides on a poll (its `complete`), so a busy worker makes one request per
      cycle: the poll commits it before claiming more work and answers it. With no poll out,
      the slot it frees starts one; while a poll is out that followed an answer with every
      task it asked for (a backlog), it waits up to 20 ms for the next; while the poll out
      waits for work, it starts a poll of its own that does not wait, so that its report and
      the claim of the work it makes ready commit together (successes finishing meanwhile go on
      the next such poll). A success that a failed poll carried is sent on its own; a server
      that refuses `complete` in polls (it predates it) gets every success on its own.
    - Successes sent on their own go in batches (`batch_completions`, default on): those that
      finish while a report is in flight go together in the next `POST /api/v1/tasks/complete`.
    - A task whose (queue, command) has no handler is reported as a non-retryable failure.
    - When the poll answer carries `max_output_bytes`, an output larger than that as JSON fails
      the step for good with an error saying so, instead of being sent.
    - Poll errors are logged and retried with backoff; the loop never exits on its own.
    - `run()` handles SIGTERM and SIGINT (`stop()` does the same from code): the worker stops
      polling, sets `Task.shutting_down`, waits up to `shutdown_grace` seconds (a second
      signal: not at all) for running handlers to finish and be reported, then **abandons**
      the rest: `Task.cancelled` turns true, async handlers are cancelled, sync handlers'
      threads are left to the process's exit, nothing is reported, and the server hands the
      tasks out again once their leases lapse. Handlers should therefore be idempotent (see
      `Task.idempotency_key`).
    """

    def __init__(
        self,
        server: str | None = None,
        *,
        queues: list[str] | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        token: str | None = None,
        namespace: str | None = None,
        worker_id: str | None = None,
        poll_wait: float = DEFAULT_POLL_WAIT,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        batch_completions: bool = True,
        retry_backoff: tuple[float, float] = (DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX),
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.worker_id = worker_id if worker_id is not None else f"{socket.gethostname() or 'worker'}-{os.getpid()}"
        if not self.worker_id.strip():
            raise ValueError("the worker id must not be empty")
        self.connection = Connection.resolve(server, token, None, None)
        self.namespace = namespace
        self.concurrency = concurrency
        self.poll_wait = poll_wait
        self.shutdown_grace = shutdown_grace
        self.batch_completions = batch_completions
        self.retry_backoff = retry_backoff
        self._queues = list(queues) if queues is not None else None
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._run: _Run | None = None
        self._stop_before_start = False

    @property
    def queues(self) -> list[str]:
        """The queues this worker polls."""
        if self._queues is not None:
            return list(self._queues)
        return sorted({queue for queue, _ in self._handlers})

    def handler(self, queue: str, command: str) -> Callable[[H], H]:
        """Registers the decorated function (sync or async, taking a `Task`) for `command` on
        `queue`. It returns the output (any JSON), a `CheckLater` or an `AwaitCallback`, or
        raises: `NonRetryable` fails the step at once, any other exception is a retryable
        failure."""

        if self._queues is not None and queue not in self._queues:
            raise ValueError(f"a handler for queue {queue!r}, which is not among the queues polled {self._queues}")

        def register(function: H) -> H:
            self._handlers[(queue, command)] = function
            return function

        return register

    def run(self) -> None:
        """Runs until SIGTERM or SIGINT (or `stop()`), then shuts down gracefully. Blocks."""
        asyncio.run(self._serve_until_signalled())

    async def _serve_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for number in signals:
            loop.add_signal_handler(number, self.stop)
        try:
            await self.serve()
        finally:
            for number in signals:
                loop.remove_signal_handler(number)

    def stop(self) -> None:
        """Asks the worker to stop gracefully (from any thread); asked again while stopping, it
        ends the grace period at once."""
        run = self._run
        if run is None:
            self._stop_before_start = True
        else:
            run.loop.call_soon_threadsafe(run.request_stop)

    async def serve(self) -> None:
        """Runs the worker on the running event loop until `stop()`, then shuts down gracefully."""
        queues = self.queues
        if not queues:
            raise ValueError("the worker polls no queue: name them with queues=[...] or register handlers")
        limits = httpx.Limits(max_connections=self.concurrency + 8, max_keepalive_connections=self.concurrency + 8)
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT, limits=limits) as http:
            run = _Run(self, queues, _Transport(self.connection, http))
            self._run = run
            try:
                if self._stop_before_start:
                    self._stop_before_start = False
                    run.request_stop()
                await run.serve()
            finally:
                self._run = None


class _Run:
    """One run of a worker: its transport, slots, running tasks and stop signals."""

    def __init__(self, worker: Worker, queues: list[str], transport: _Transport) -> None:
        self.worker = worker
        self.queues = queues
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        self.completions = _Completions(transport, batch=worker.batch_completions, want_poll=self.want_poll)
        self.slots = _Slots(worker.concurrency)
        # Polls that do not wait, for successes while the loop's poll waits for work.
        self.polls_for_successes: asyncio.Task[None] | None = None
        self.running: set[asyncio.Task[None]] = set()
        self.stopping = asyncio.Event()
        self.hurry = asyncio.Event()
        self.shutdown = Flag()
        self.abandoned = Flag()

    def request_stop(self) -> None:
        if self.stopping.is_set():
            log.warning("asked again to stop: ending the grace period now")
            self.hurry.set()
        else:
            log.info("stopping: no more polls; running tasks may finish within %s s", self.worker.shutdown_grace)
            self.stopping.set()

    def backoff(self) -> Backoff:
        initial, maximum = self.worker.retry_backoff
        return Backoff(initial, maximum)

    async def unless_stopped(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T] | None:
        """Runs `work` until it ends (its task, done) or the worker is asked to stop first
        (`None`, `work` cancelled)."""
        running = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            running.cancel()
            raise
        finally:
            stopping.cancel()
        if running.done():
            return running
        running.cancel()
        await asyncio.wait({running})
        return None

    async def serve(self) -> None:
        worker = self.worker
        log.info("worker %s started: queues %s, concurrency %d", worker.worker_id, self.queues, worker.concurrency)
        await self.poll_until_stopped()
        if self.polls_for_successes is not None:
            await asyncio.wait({self.polls_for_successes})
        self.completions.polling_stopped()
        self.shutdown.set()
        await self.drain()
        self.completions.stop()
        log.info("worker %s stopped", worker.worker_id)

    async def poll_until_stopped(self) -> None:
        worker = self.worker
        backoff = self.backoff()
        while not self.stopping.is_set():
            taking = await self.unless_stopped(self.slots.take_all(settle=self.completions.backlog_found()))
            if taking is None:
                return
            alone = self.polls_for_successes is None
            ended = await self.poll(taking.result(), wait=worker.poll_wait, alone=alone, backing_off=True)
            if ended is _STOPPED:
                return
            if ended is _ANSWERED:
                backoff.reset()
            elif isinstance(ended, Exception):
                delay = backoff.next_delay()
                if isinstance(ended, httpx.RequestError) or (isinstance(ended, ProblemError) and ended.retryable):
                    log.warning("poll failed: %s; retrying in %.2f s", ended, delay)
                else:
                    log.error("poll failed: %s; retrying in %.2f s (is the worker configured right?)", ended, delay)
                if await self.unless_stopped(asyncio.sleep(delay)) is None:
                    return
                self.completions.polling_again()

    def want_poll(self) -> None:
        """A success waits for a poll while the loop's poll waits for work: polls that do not
        wait carry it, one at a time (those that finish meanwhile go on the next)."""
        if self.polls_for_successes is None and not self.stopping.is_set():
            self.polls_for_successes = asyncio.ensure_future(self.poll_for_successes())

    async def poll_for_successes(self) -> None:
        try:
            while self.completions.waiting_for_poll():
                free = self.slots.take_free()
                if free == 0:
                    # The loop's next poll takes the slots, and the successes with them.
                    return
                ended = await self.poll(free, wait=0, alone=False, backing_off=False)
                if ended is _STOPPED:
                    return
                if isinstance(ended, Exception):
                    # Its successes, and those waiting, went back to be sent on their own.
                    log.warning("poll with successes failed: %s", ended)
                    return
        finally:
            self.polls_for_successes = None

    async def poll(self, free: int, *, wait: float, alone: bool, backing_off: bool) -> str | Exception:
        """Polls for up to `free` tasks (holding that many slots), carrying the successes that
        wait for a poll, and starts the tasks leased; `alone`: no other poll is out;
        `backing_off`: a failure makes the loop back off. Returns `_ANSWERED`, `_AGAIN` (refused
        for the successes it carried: poll again at once), `_STOPPED` or the error."""
        worker = self.worker
        carrying = self.completions.poll_sent(alone=alone)
        asked = min(free, _MAX_TASKS_PER_POLL)
        call = _protocol.poll(
            self.queues,
            worker_id=worker.worker_id,
            max_tasks=asked,
            wait=wait,
            namespace=worker.namespace,
            complete=carrying.tasks(),
        )
        polling = await self.unless_stopped(self.transport.send(call))
        if polling is None:
            # Tasks leased to this poll in that instant are retried once their lease lapses;
            # the successes it carried are sent on their own.
            self.slots.give(free)
            self.completions.poll_cut_off(carrying)
            return _STOPPED
        received = self.loop.time()
        try:
            answer = polling.result()
            tasks = list(answer["tasks"])
        except (ProblemError, httpx.RequestError, ValueError, KeyError, TypeError) as error:
            self.slots.give(free)
            if self.completions.poll_failed(carrying, error, backing_off=backing_off):
                return _AGAIN
            return error
        # Every task it asked for: the queue had a backlog.
        self.completions.poll_answered(carrying, answer, backlog=len(tasks) >= asked)
        if len(tasks) > free:
            log.warning("the server sent %d tasks for %d free slots; leaving the rest to expire and be retried", len(tasks), free)
        leased_now = tasks[:free]
        self.slots.give(free - len(leased_now))
        max_output_bytes = answer.get("max_output_bytes")
        for leased in leased_now:
            limit = leased.get("max_output_bytes", max_output_bytes)
            slot = _Slot(self.slots)
            self.start(self.supervise(leased, received, limit, slot), slot)
        return _ANSWERED

    def start(self, supervising: Awaitable[None], slot: _Slot) -> None:
        running = asyncio.ensure_future(supervising)
        self.running.add(running)
        running.add_done_callback(lambda ended: self.finished(ended, slot))

    def finished(self, running: asyncio.Task[None], slot: _Slot) -> None:
        self.running.discard(running)
        slot.release()
        if not running.cancelled() and running.exception() is not None:
            log.error("a task supervisor failed", exc_info=running.exception())

    async def drain(self) -> None:
        """Waits up to the grace period for running tasks, then abandons the rest."""
        if self.running:
            log.info("shutting down: waiting up to %s s for %d running tasks", self.worker.shutdown_grace, len(self.running))
        deadline = self.loop.time() + self.worker.shutdown_grace
        while self.running and not self.hurry.is_set():
            left = deadline - self.loop.time()
            if left <= 0:
                break
            hurrying = asyncio.ensure_future(self.hurry.wait())
            await asyncio.wait({*self.running, hurrying}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            hurrying.cancel()
        if self.running:
            log.warning(
                "abandoning %d running tasks: their leases will lapse and the server will retry them",
                len(self.running),
            )
            self.abandoned.set()
            abandoned = list(self.running)
            for running in abandoned:
                running.cancel()
            await asyncio.gather(*abandoned, return_exceptions=True)

    def handler_for(self, queue: str, command: str) -> Handler | None:
        return self.worker._handlers.get((queue, command))

    async def supervise(self, leased: dict[str, Any], received: float, max_output_bytes: int | None, slot: _Slot) -> None:
        """Runs one leased task to its report, holding `slot` until then (or until its success
        is handed to the next poll)."""
        task = Task(leased, self.shutdown, self.abandoned)
        lease = leased["lease_ms"] / 1000
        # The latest instant the lease may last to: the server set (or extended) it to at most
        # "when its answer came + lease".
        lease_end = [received + lease]
        handler = self.handler_for(task.queue, task.command)
        if handler is None:
            message = f"no handler for command {task.command} on queue {task.queue} in worker {self.worker.worker_id}"
            log.warning("%s", message)
            report = _failure(task, message, retryable=False)
        else:
            log.debug("running %r", task)
            is_async = is_coroutine_function(handler)
            run: asyncio.Future[Any] = asyncio.ensure_future(handler(task)) if is_async else _in_thread(handler, task)
            beat = asyncio.ensure_future(self.heartbeat(task, lease, lease_end, run if is_async else None))
            try:
                await asyncio.wait({run})
            except asyncio.CancelledError:
                run.cancel()
                raise
            finally:
                beat.cancel()
            if task.lease_lost:
                log.info("%r: the lease was lost while running; the outcome is not reported", task)
                return
            if run.cancelled():
                report = _failure(task, "the handler was cancelled", retryable=True)
            else:
                raised = run.exception()
                report = report_for(task, None if raised else run.result(), raised, max_output_bytes)
        await self.report(task, report, lease_end, slot)

    async def heartbeat(
        self, task: Task, lease: float, lease_end: list[float], cancellable: asyncio.Future[Any] | None
    ) -> None:
        """Extends the lease every `lease / 3` (at most every 10 s) until cancelled; when the server
        says the task is no longer ours, marks it lost (cancelling an async handler) and stops."""
        interval = heartbeat_interval(lease)
        timeout = min(max(interval, 1.0), 30.0)
        while True:
            await asyncio.sleep(interval)
            progress_set, progress = task.current_progress()
            call = _protocol.heartbeat(task.id, task.leased.lease_token, progress if progress_set else None, timeout=timeout)
            try:
                await self.transport.send(call)
            except ProblemError as error:
                if error.status in _NOT_OURS:
                    log.warning("%r: the lease was lost (%s); cancelling the task", task, error)
                    task.lose_lease()
                    if cancellable is not None:
                        cancellable.cancel()
                    return
                if error.retryable:
                    # The server may have extended the lease although the answer was an error.
                    lease_end[0] = max(lease_end[0], self.loop.time() + lease)
                log.warning("%r: heartbeat failed: %s", task, error)
            except httpx.RequestError as error:
                if not isinstance(error, httpx.ConnectError):
                    lease_end[0] = max(lease_end[0], self.loop.time() + lease)
                log.warning("%r: heartbeat failed: %s", task, error or type(error).__name__)
            except ValueError:
                lease_end[0] = max(lease_end[0], self.loop.time() + lease)
                log.warning("%r: heartbeat answered, but unreadably", task)
            else:
                lease_end[0] = max(lease_end[0], self.loop.time() + lease)

    async def report(self, task: Task, report: Report, lease_end: list[float], slot: _Slot) -> None:
        """Sends the report, retrying transport errors and 5xx until the lease has surely expired.
        A success handed to the next poll gives up `slot`."""
        if report.kind == "fail":
            error = report.call.body["error"]
            log.info("%r failed: %s (retryable: %s)", task, error["message"], error["retryable"])
        backoff = self.backoff()
        while True:
            failure: Exception
            try:
                if report.batch_item is not None:
                    answer = await self.completions.complete(report, slot.release)
                else:
                    answer = await self.transport.send(report.call)
            except ProblemError as error:
                if error.status in _NOT_OURS:
                    log.warning("%r: %s report dropped, the task is no longer ours: %s", task, report.kind, error)
                    return
                if not error.retryable:
                    log.error("%r: the %s report was rejected: %s", task, report.kind, error)
                    return
                failure = error
            except httpx.RequestError as error:
                failure = error
            except ValueError as error:
                log.warning("%r: reported %s, but the answer was unreadable: %s", task, report.kind, error)
                return
            else:
                # A single report answers a dict, a batched one a View: both have `get`.
                log.info(
                    "%r: reported %s (task %s, job %s)",
                    task,
                    report.kind,
                    answer.get("task_status"),
                    answer.get("job_status"),
                )
                return
            now = self.loop.time()
            if now >= lease_end[0]:
                log.error(
                    "%r: giving up the %s report (%s): the lease has expired, the server will retry the task",
                    task,
                    report.kind,
                    failure,
                )
                return
            delay = min(backoff.next_delay(), lease_end[0] - now)
            log.warning("%r: %s report failed: %s; retrying in %.2f s", task, report.kind, failure, delay)
            await asyncio.sleep(delay)
