"""A worker process for the tests: `python behaviours.py SERVER_URL STATE_DIR`.

It serves queue `py` with one handler per behaviour under test. Handlers tell the test what they
do through files in STATE_DIR (`started-<task>-<attempt>` holds the worker's id) and wait for
the test's go-ahead the same way (`release-<task>`), always with a deadline. Settings come from
the environment: WORKER_ID, CONCURRENCY, GRACE (the shutdown grace, seconds), POLL_WAIT
(seconds, default 2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from starbridge import AwaitCallback, CheckLater, NonRetryable, Task, Worker

# Longest a handler waits for the test (a liveness bound: the test fails well before).
PATIENCE = 120.0

server, state = sys.argv[1], Path(sys.argv[2])
worker_id = os.environ["WORKER_ID"]
worker = Worker(
    server,
    queues=["py"],
    worker_id=worker_id,
    concurrency=int(os.environ.get("CONCURRENCY", "4")),
    shutdown_grace=float(os.environ.get("GRACE", "30")),
    poll_wait=float(os.environ.get("POLL_WAIT", "2")),
)


def tell(name: str, text: str) -> None:
    """Writes a file of the state folder whole (renamed into place): a test that sees it
    exists reads all of it."""
    draft = state / f".{name}.draft"
    draft.write_text(text)
    os.replace(draft, state / name)


def started(task: Task) -> None:
    tell(f"started-{task.id}-{task.attempt}", worker_id)


def released(task: Task) -> bool:
    """Waits (up to PATIENCE) for the test to release the task; False if it never does."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        if (state / f"release-{task.id}").exists():
            return True
        time.sleep(0.01)
    return False


@worker.handler("py", "sync_echo")
def sync_echo(task: Task) -> dict[str, Any]:
    return {"echo": task.input, "thread": threading.current_thread() is not threading.main_thread(), "by": worker_id}


@worker.handler("py", "traceparent")
def traceparent(task: Task) -> dict[str, Any]:
    return {"traceparent": task.traceparent}


@worker.handler("py", "async_echo")
async def async_echo(task: Task) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"echo": task.input, "loop": asyncio.get_running_loop().is_running(), "by": worker_id}


@worker.handler("py", "hold")
def hold(task: Task) -> dict[str, Any]:
    """Holds its first attempt until released (or forever, for a worker that gets killed)."""
    started(task)
    if task.attempt == 1 and not released(task):
        raise RuntimeError("never released")
    return {"attempt": task.attempt, "by": worker_id}


@worker.handler("py", "report_progress")
def report_progress(task: Task) -> dict[str, Any]:
    task.log("copying", table="users", rows=10)
    task.progress({"copied": 10})
    started(task)
    if not released(task):
        raise RuntimeError("never released")
    task.log("done")
    return {"copied": 20}


@worker.handler("py", "until_shutdown")
def until_shutdown(task: Task) -> dict[str, Any]:
    started(task)
    deadline = time.monotonic() + PATIENCE
    while not task.shutting_down and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"graceful": task.shutting_down, "by": worker_id}


@worker.handler("py", "check_later")
async def check_later(task: Task) -> Any:
    polls = (task.previous_progress or {}).get("polls", 0) + 1
    if polls < 3:
        return CheckLater(after=0.05, progress={"polls": polls, "key": task.idempotency_key})
    return {"polls": polls, "attempt": task.attempt, "same_key": task.previous_progress["key"] == task.idempotency_key}


@worker.handler("py", "non_retryable")
def non_retryable(task: Task) -> None:
    raise NonRetryable("quota exhausted")


@worker.handler("py", "flaky")
async def flaky(task: Task) -> dict[str, Any]:
    if task.attempt == 1:
        raise ValueError("control plane busy")
    return {"attempt": task.attempt}


@worker.handler("py", "large_output")
def large_output(task: Task) -> dict[str, Any]:
    return {"data": "x" * int(task.input["bytes"])}


@worker.handler("py", "callback")
def callback(task: Task) -> AwaitCallback:
    tell(f"callback-{task.id}", task.callback_token)
    return AwaitCallback(timeout=PATIENCE)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("starbridge").setLevel(logging.DEBUG)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    worker.run()
    print("worker exited cleanly", flush=True)
