"""Schemathesis hooks for `.ci/schemathesis`: keep the run bounded.

A worker's poll may hold the request for `wait_ms` (up to a minute); the fuzzer's polls wait at
most 100 ms so the run's length depends on the number of examples only.
"""

import schemathesis

MAX_WAIT_MS = 100


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("wait_ms"), int) and body["wait_ms"] > MAX_WAIT_MS:
        body["wait_ms"] = MAX_WAIT_MS
