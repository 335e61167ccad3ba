"""Seeds a fresh server for `.ci/schemathesis` and writes the schemathesis configuration that
points the fuzzer at what exists: a workflow, jobs, a leased task, a schedule and a webhook.
Without them nearly every `{id}` and `{name}` the fuzzer makes up is a 404 and the handlers'
own logic is never reached.

Usage: python3 schemathesis_seed.py BASE_URL CONFIG_PATH
"""

import json
import sys
import urllib.request

WORKFLOW = """\
description: seeded for API fuzzing
params: {type: object, properties: {n: {type: integer}}}
steps:
- {id: a, queue: q, command: c, compensate: {queue: q, command: undo}}
- {id: b, queue: q, command: c, retry: {max_attempts: 3}}
"""


def call(base, method, path, body=None, content_type="application/json"):
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def toml_list(values):
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def main():
    base, config_path = sys.argv[1], sys.argv[2]
    call(base, "PUT", "/api/v1/workflows/wf", WORKFLOW, "application/yaml")
    jobs = [call(base, "POST", "/api/v1/jobs", {"workflow": "wf", "params": {"n": n}})["id"] for n in range(3)]
    polled = call(base, "POST", "/api/v1/tasks/poll", {"worker_id": "seed", "queues": ["q"], "max_tasks": 2})
    tasks = [task["id"] for task in polled["tasks"]]
    leases = [task["lease_token"] for task in polled["tasks"]]
    call(base, "PUT", "/api/v1/schedules/nightly", {"workflow": "wf", "cron": "0 3 * * *"})
    webhook = call(base, "POST", "/api/v1/webhooks", {"url": "http://127.0.0.1:9/hook"})["id"]

    sections = [
        ("jobs", jobs),
        ("tasks", tasks),
        ("leases", leases),
        ("names", ["wf", "nightly", "q"]),
        ("webhooks", [webhook]),
        ("namespaces", ["default"]),
    ]
    lines = []
    for name, values in sections:
        lines += [f"[dictionaries.{name}]", f"values = {toml_list(values)}", ""]
    lines += ["[parameters]", '"query.namespace" = { dictionary = "namespaces", probability = 0.7 }', ""]
    operations = [
        (r"^/api/v1/jobs$", '"body.workflow" = { dictionary = "names", probability = 0.7 }'),
        (r"^/api/v1/jobs/\{id\}", '"path.id" = { dictionary = "jobs", probability = 0.8 }, "path.task" = { dictionary = "tasks", probability = 0.8 }'),
        (r"^/api/v1/tasks/\{id\}", '"path.id" = { dictionary = "tasks", probability = 0.8 }, "body.lease_token" = { dictionary = "leases", probability = 0.8 }'),
        (r"^/api/v1/(workflows|schedules|queues)/\{name\}", '"path.name" = { dictionary = "names", probability = 0.8 }'),
        (r"^/api/v1/webhooks/\{id\}", '"path.id" = { dictionary = "webhooks", probability = 0.8 }'),
    ]
    for regex, parameters in operations:
        lines += ["[[operations]]", f"include-path-regex = {json.dumps(regex)}", f"parameters = {{ {parameters} }}", ""]
    with open(config_path, "w") as out:
        out.write("\n".join(lines))


if __name__ == "__main__":
    main()
