"""The real parts the SDK's tests run against: a `starbridge server` process on a free loopback
port with a fresh SQLite file per test, and worker processes running the Python scripts of
tests/workers/ (or the example worker). Every wait is on a condition with a deadline.

The binary is `STARBRIDGE_BIN`, by default target/debug/starbridge of this repository (the test
script builds it)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generator, Iterator

import httpx
import pytest

from starbridge import Client

from support import BIN, WORKERS, eventually


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Server:
    """A `starbridge server` process on a loopback port and a SQLite file of `directory`."""

    url: str
    directory: Path
    command: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Starts the server (again, after `kill`: same port, same database) and waits until
        it is healthy."""
        env = dict(os.environ, STARBRIDGE_LOG="info", NO_COLOR="1")
        env.pop("STARBRIDGE_TOKEN", None)
        process = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env
        )
        self.process = process

        def healthy() -> bool:
            if process.poll() is not None:
                pytest.fail(f"the server exited with {process.returncode}:\n{self.log.read_text()}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        eventually(healthy, "the server to answer /healthz")

    def kill(self) -> None:
        """kill -9."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()


def start_server(directory: Path, *flags: str) -> Server:
    """`starbridge server` on a free loopback port and a fresh SQLite file, once healthy."""
    if not BIN.is_file():
        pytest.fail(f"no starbridge binary at {BIN}: run `cargo build` or set STARBRIDGE_BIN")
    port = free_port()
    database = f"sqlite://{directory}/starbridge.db"
    command = [str(BIN), "server", "--listen", f"127.0.0.1:{port}", "--database", database, *flags]
    server = Server(f"http://127.0.0.1:{port}", directory, command, directory / "server.log")
    server.start()
    return server


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keeps each phase's report on the test, for fixtures to print logs of failed tests."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "report_call", None)
    return report is None or report.failed


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Server]:
    """A server whose webhooks may reach loopback receivers of the test (and nothing else)."""
    running = start_server(tmp_path, "--webhook-allow", "127.0.0.1")
    yield running
    running.kill()
    if _failed(request):
        print(f"--- server log ({running.log})\n{running.log.read_text()[-20000:]}")


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url) as connected:
        yield connected


@dataclass
class WorkerProcess:
    """A Python worker process of these tests."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def exited(self) -> bool:
        return self.process.poll() is not None

    def output(self) -> str:
        return self.log.read_text()


@dataclass
class Workers:
    """Starts worker processes (`python SCRIPT SERVER_URL STATE_DIR`) and ends those still
    running when the test ends."""

    server: Server
    state: Path
    started: list[WorkerProcess] = field(default_factory=list)

    def start(self, script: Path | str, name: str, **env: str) -> WorkerProcess:
        path = Path(script) if Path(script).is_absolute() else WORKERS / script
        log = self.server.directory / f"{name}.log"
        environment = dict(os.environ, WORKER_ID=name, PYTHONUNBUFFERED="1", **env)
        process = subprocess.Popen(
            [sys.executable, str(path), self.server.url, str(self.state)],
            stdin=subprocess.DEVNULL,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=environment,
        )
        worker = WorkerProcess(name, process, log)
        self.started.append(worker)
        return worker

    def signal(self, worker: WorkerProcess, number: signal.Signals) -> None:
        worker.process.send_signal(number)

    def wait_exit(self, worker: WorkerProcess) -> int:
        eventually(worker.exited, f"worker {worker.name} to exit")
        return worker.process.returncode

    def end_all(self) -> None:
        for worker in self.started:
            if worker.process.poll() is None:
                worker.process.kill()
            worker.process.wait()


@pytest.fixture
def workers(server: Server, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Workers]:
    state = tmp_path / "state"
    state.mkdir()
    started = Workers(server, state)
    yield started
    started.end_all()
    if _failed(request):
        for worker in started.started:
            print(f"--- worker {worker.name} ({worker.log})\n{worker.output()[-20000:]}")
