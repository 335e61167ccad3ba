"""Schemathesis hooks for `.ci/schemathesis`: keep the run bounded and on this machine.

A worker's poll may hold the request for `wait_ms` (up to a minute); the fuzzer's polls wait at
most 100 ms so the run's length depends on the number of examples only. Webhooks the fuzzer
creates point at a closed port on the loopback address (which the server is started to allow),
so their deliveries never leave the machine.
"""

import schemathesis

MAX_WAIT_MS = 100
LOCAL_HOOK = "http://127.0.0.1:9/fuzzed"


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("wait_ms"), int) and body["wait_ms"] > MAX_WAIT_MS:
        body["wait_ms"] = MAX_WAIT_MS
    if (
        case.method.upper() == "POST"
        and case.path == "/api/v1/webhooks"
        and isinstance(body, dict)
        and isinstance(body.get("url"), str)
    ):
        body["url"] = LOCAL_HOOK
