#!/usr/bin/env python3
"""Soak test (not run in CI): a release `starbridge server` on a fresh SQLite file, shell workers
that are killed at random and restarted, and a mixed load of jobs (a sequence with retries, a
fan-out, a failing step rolled back, operator retries) for a fixed time. Every 10 seconds it prints
the server's resident memory, the jobs per status and the database size; at the end it checks that
memory stayed flat (the last third of the samples at most 25% above the first third) and that no
job is stuck.

    cargo build --release && python3 scripts/soak.py --minutes 10

Only the Python standard library is used.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

WORKFLOWS = {
    "soak_sequence": """
steps:
  - id: prepare
    queue: soak
    timeout: 5s
    command: |
      echo '{"n": 1}'
  - id: flaky
    queue: soak
    timeout: 5s
    command: test "$(od -An -N1 -tu1 /dev/urandom)" -gt 85
    retry: { max_attempts: 10, initial: 50ms }
  - id: finish
    queue: soak
    timeout: 5s
    command: echo done
""",
    "soak_fanout": """
steps:
  - id: list
    queue: soak
    timeout: 5s
    command: |
      echo '{"items": [1, 2, 3, 4, 5, 6, 7, 8]}'
  - id: each
    queue: soak
    timeout: 5s
    command: echo "$INPUT_ITEM"
    for_each: "${{ steps.list.output.items }}"
    input: { item: "${{ item }}" }
    concurrency: 4
  - id: join
    queue: soak
    timeout: 5s
    command: echo joined
""",
    "soak_rollback": """
steps:
  - id: reserve
    queue: soak
    timeout: 5s
    command: echo reserved
    compensate: { queue: soak, command: echo released, timeout: 5s }
  - id: fail
    queue: soak
    timeout: 5s
    command: exit 1
""",
}

TERMINAL = {"succeeded", "failed", "compensation_failed", "cancelled", "timed_out"}


def call(base, method, path, body=None, text=None):
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    elif text is not None:
        data = text.encode()
        headers["content-type"] = "application/yaml"
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, None


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--binary", default="target/release/starbridge")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20.0, help="jobs submitted per second")
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="starbridge-soak-")
    database = os.path.join(folder, "soak.db")
    port = 7600 + random.randrange(300)
    base = f"http://127.0.0.1:{port}"
    environment = dict(os.environ, STARBRIDGE_LOG="error")
    server = subprocess.Popen(
        [args.binary, "server", "--listen", f"127.0.0.1:{port}", "--database", f"sqlite://{database}"],
        env=environment,
    )
    workers = []
    stop = threading.Event()
    try:
        deadline = time.time() + 30
        while call(base, "GET", "/healthz")[0] != 200:
            if time.time() > deadline:
                sys.exit("the server did not start")
            time.sleep(0.1)
        for name, yaml in WORKFLOWS.items():
            status, _ = call(base, "PUT", f"/api/v1/workflows/{name}", text=yaml)
            assert status in (200, 201), status

        def start_worker(index):
            return subprocess.Popen(
                [args.binary, "worker", "--queue", "soak", "--concurrency", "8",
                 "--worker-id", f"soak-{index}-{time.time():.0f}", "--server", base],
                env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )

        workers = [start_worker(i) for i in range(args.workers)]
        submitted = []

        def submit_load():
            names = list(WORKFLOWS)
            while not stop.is_set():
                status, job = call(base, "POST", "/api/v1/jobs", {"workflow": random.choice(names)})
                if status == 201:
                    submitted.append(job["id"])
                time.sleep(1.0 / args.rate)

        def operate_load():
            # Now and then an operator retries a failed job (it fails again: the step always fails).
            while not stop.wait(5):
                status, page = call(base, "GET", "/api/v1/jobs?status=failed&limit=5")
                for job in (page or {}).get("items", []):
                    call(base, "POST", f"/api/v1/jobs/{job['id']}/retry", {"reason": "soak"})

        threads = [threading.Thread(target=submit_load), threading.Thread(target=operate_load)]
        for thread in threads:
            thread.start()

        samples = []
        kills = 0
        end = time.time() + args.minutes * 60
        print(f"{'t (s)':>6} {'rss (MiB)':>10} {'db (MiB)':>9} {'kills':>6}  jobs by status")
        started = time.time()
        next_kill = time.time() + random.uniform(5, 15)
        while time.time() < end:
            time.sleep(1)
            if time.time() >= next_kill:
                victim = random.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait()
                workers[victim] = start_worker(victim)
                kills += 1
                next_kill = time.time() + random.uniform(5, 15)
            if int(time.time() - started) % 10 == 0:
                rss = rss_kib(server.pid) / 1024
                size = sum(
                    os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)
                ) / 2**20
                counts = {}
                for status in ("running", "succeeded", "failed", "compensating"):
                    _, page = call(base, "GET", f"/api/v1/jobs?status={status}&limit=500")
                    counts[status] = len((page or {}).get("items", []))
                samples.append(rss)
                shown = " ".join(f"{k}={v}{'+' if v == 500 else ''}" for k, v in counts.items())
                print(f"{time.time() - started:6.0f} {rss:10.1f} {size:9.1f} {kills:6d}  {shown}", flush=True)
                time.sleep(1)
        stop.set()
        for thread in threads:
            thread.join()

        # Every job ends once the load stops (killed workers' tasks are retried after their leases).
        settle = time.time() + 120
        unfinished = list(submitted)
        while unfinished and time.time() < settle:
            still = []
            for job_id in unfinished:
                _, job = call(base, "GET", f"/api/v1/jobs/{job_id}")
                if not job or job.get("status") not in TERMINAL:
                    still.append(job_id)
            unfinished = still
            if unfinished:
                time.sleep(2)
        third = max(1, len(samples) // 3)
        first, last = samples[:third], samples[-third:]
        growth = (sum(last) / len(last)) / (sum(first) / len(first))
        print(f"\n{len(submitted)} jobs, {kills} worker kills; rss first third {sum(first)/len(first):.1f} MiB, "
              f"last third {sum(last)/len(last):.1f} MiB (x{growth:.2f}); unfinished jobs: {len(unfinished)}")
        ok = growth <= 1.25 and not unfinished
        print("PASS" if ok else "FAIL")
        sys.exit(0 if ok else 1)
    finally:
        stop.set()
        for worker in workers:
            worker.kill()
        server.kill()


if __name__ == "__main__":
    main()
