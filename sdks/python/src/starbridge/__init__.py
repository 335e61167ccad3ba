"""The Python SDK of Starbridge, a durable workflow engine.

- `Client`: every operation of the HTTP API (workflows, jobs, operator actions, signals,
  approvals, callbacks, queues, schedules, webhooks, tokens, audit, health, the worker
  protocol). Errors raise `ProblemError` with the server's problem document.
- `Worker`: runs sync and async handlers for (queue, command) pairs, with bounded concurrency,
  heartbeats, batched reports and a graceful stop on SIGTERM/SIGINT. A handler gets a `Task`,
  returns its output (or `CheckLater` / `AwaitCallback`) and raises `NonRetryable` to fail the
  step for good.

```python
from starbridge import Client, Worker, Task

worker = Worker("http://127.0.0.1:7433", queues=["mysql"], concurrency=16)

@worker.handler("mysql", "init_instance")
def init_instance(task: Task) -> dict:
    return {"instance_id": "i-42"}

worker.run()
```
"""

from starbridge._client import FINAL_JOB_STATUSES, Client
from starbridge._http import Call, FieldProblem, ProblemError
from starbridge._outcomes import AwaitCallback, CheckLater, NonRetryable
from starbridge._task import Task
from starbridge._version import __version__
from starbridge._views import View
from starbridge._worker import DEFAULT_SHUTDOWN_GRACE, Worker

# The public classes show as `starbridge.X` (in tracebacks and reprs), not by their module.
for _public in (AwaitCallback, Call, CheckLater, Client, FieldProblem, NonRetryable, ProblemError, Task, View, Worker):
    _public.__module__ = __name__
del _public

__all__ = [
    "AwaitCallback",
    "Call",
    "CheckLater",
    "Client",
    "DEFAULT_SHUTDOWN_GRACE",
    "FINAL_JOB_STATUSES",
    "FieldProblem",
    "NonRetryable",
    "ProblemError",
    "Task",
    "View",
    "Worker",
    "__version__",
]
