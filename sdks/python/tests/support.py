"""Helpers the SDK's tests share: where things are, and waiting on a condition with a deadline."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from starbridge import Client

REPO = Path(__file__).resolve().parents[3]
WORKERS = Path(__file__).resolve().parent / "workers"
EXAMPLE_WORKER = REPO / "examples" / "python" / "worker.py"
EXAMPLE_WORKFLOW = REPO / "examples" / "python" / "create_mysql_instance.yaml"
BIN = Path(os.environ.get("STARBRIDGE_BIN") or REPO / "target" / "debug" / "starbridge")
#: How long a test waits for anything before declaring it stuck (a liveness bound, not a benchmark).
STUCK = 90.0


def eventually(condition: Callable[[], Any], what: str, timeout: float = STUCK) -> Any:
    """Checks `condition` until it returns something truthy (returned), failing the test after
    `timeout` seconds with `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def one_step(client: Client, name: str, command: str, **step: Any) -> None:
    """Applies workflow `name`: one step `work` running `command` on queue `py`, with `step`'s
    other fields (timeout, retry, …)."""
    client.apply({"name": name, "steps": [{"id": "work", "queue": "py", "command": command, **step}]})

