"""The wire layer shared by the client and the worker: how a call is described, sent (by a
synchronous or an asynchronous httpx client) and answered, and the error every non-2xx answer
becomes (`ProblemError`, carrying the server's RFC 9457 problem document).

Nothing here performs I/O itself: `Connection.request` turns a `Call` into an `httpx.Request`
and `decode` turns an `httpx.Response` into JSON or a `ProblemError`, so the synchronous `Client`
and the worker's asynchronous transport send the very same requests.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple, Sequence
from urllib.parse import quote

import httpx

from starbridge._version import __version__

DEFAULT_SERVER = "http://127.0.0.1:7433"
USER_AGENT = f"starbridge-python/{__version__}"
JSON = "application/json"
YAML = "application/yaml"
# The longest body text quoted in a problem made up from an answer that is not one.
_MAX_QUOTED_BODY = 512


class FieldProblem(NamedTuple):
    """One field at fault in a problem document: `field` (a body field, query parameter, header,
    or definition location such as `steps[0] (a).timeout`) and what is wrong with it."""

    field: str
    message: str


class ProblemError(Exception):
    """A non-2xx answer of the Starbridge server, with its RFC 9457 problem document.

    `status`, `type`, `title`, `detail`, `errors` (the fields at fault, as `FieldProblem`s) and
    `limit` (on `/problems/limit-exceeded`) come from the document; `problem` is the document
    itself. An answer that is not a problem document is turned into one from its status and
    body, as the Rust client does.
    """

    def __init__(self, problem: dict[str, Any]) -> None:
        self.problem = problem
        self.status: int = int(problem.get("status") or 0)
        self.type: str = str(problem.get("type") or "about:blank")
        self.title: str = str(problem.get("title") or "")
        self.detail: str = str(problem.get("detail") or self.title)
        self.errors: list[FieldProblem] = [
            FieldProblem(str(item.get("field", "")), str(item.get("message", "")))
            for item in problem.get("errors") or []
            if isinstance(item, dict)
        ]
        limit = problem.get("limit")
        self.limit: dict[str, Any] | None = limit if isinstance(limit, dict) else None
        super().__init__(self._describe())

    @property
    def fields(self) -> list[str]:
        """The names of the fields at fault, in the document's order."""
        return [problem.field for problem in self.errors]

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later (the server failed or is busy)."""
        return self.status >= 500

    def _describe(self) -> str:
        text = f"{self.title} ({self.status})"
        if self.detail and self.detail != self.title:
            text += f": {self.detail}"
        for problem in self.errors:
            if problem.message not in self.detail:
                text += f"; {problem.field}: {problem.message}"
        return text


def problem_from_answer(status: int, reason: str, body: bytes) -> dict[str, Any]:
    """The problem document a non-2xx answer carries, or one made up from its status and body.
    The answer's status wins over whatever the body claims."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "title" in parsed and "status" in parsed:
        problem = dict(parsed)
    else:
        detail = None
        if isinstance(parsed, dict):
            for key in ("detail", "message", "error", "title"):
                if isinstance(parsed.get(key), str):
                    detail = parsed[key]
                    break
        if detail is None:
            text = body.decode("utf-8", "replace").strip()
            if len(text) > _MAX_QUOTED_BODY:
                text = text[:_MAX_QUOTED_BODY] + "…"
            detail = text or reason
        problem = {"type": "about:blank", "title": reason, "detail": detail}
    problem["status"] = status
    return problem


@dataclass(frozen=True)
class Call:
    """One API request, described without sending it.

    `path` is from the server root, its segments already encoded (see `segment`); `body` is
    sent as JSON when `has_body`; `text` is a text body sent with `content_type`;
    `namespaced` adds the client's namespace as `?namespace=`; `timeout` overrides the
    client's for this call (seconds).
    """

    method: str
    path: str
    query: Sequence[tuple[str, str]] = ()
    body: Any = None
    has_body: bool = False
    text: str | None = None
    content_type: str | None = None
    namespaced: bool = True
    timeout: float | None = None


def post(path: str, body: Any = None, *, namespaced: bool = True, timeout: float | None = None) -> Call:
    """A `POST` with a JSON body (`None` sends `{}`: every body-taking action accepts it)."""
    return Call(
        "POST",
        path,
        body={} if body is None else body,
        has_body=True,
        namespaced=namespaced,
        timeout=timeout,
    )


def segment(value: str) -> str:
    """`value` percent-encoded as one path segment (a `/` in a queue name becomes `%2F`)."""
    return quote(value, safe="")


def dumps(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON; NaN and infinities are refused (`ValueError`), as is any
    value JSON cannot hold (`TypeError`)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def milliseconds(duration: float | timedelta) -> int:
    """A duration given in seconds (or as a `timedelta`) in whole milliseconds."""
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
    if seconds < 0:
        raise ValueError(f"a duration must not be negative, got {seconds} s")
    return round(seconds * 1000)


def without_none(**fields: Any) -> dict[str, Any]:
    """The fields whose value is not `None` (absent fields take the server's default)."""
    return {name: value for name, value in fields.items() if value is not None}


@dataclass(frozen=True)
class Connection:
    """Where and as whom requests go: the server's root URL (`http://host:port`, optionally with
    a path prefix), the API token (`Authorization: Bearer`), the actor (`Starbridge-Actor`, for
    servers without `--auth`) and the namespace."""

    base_url: str
    token: str | None = None
    actor: str | None = None
    namespace: str | None = None

    @staticmethod
    def resolve(
        server: str | None, token: str | None, actor: str | None, namespace: str | None
    ) -> Connection:
        """A connection from explicit settings, falling back to `STARBRIDGE_SERVER` (default
        `http://127.0.0.1:7433`) and `STARBRIDGE_TOKEN`."""
        base_url = server or os.environ.get("STARBRIDGE_SERVER") or DEFAULT_SERVER
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the server URL must start with http:// or https://, got {base_url!r}")
        return Connection(
            base_url=base_url.rstrip("/"),
            token=token or os.environ.get("STARBRIDGE_TOKEN") or None,
            actor=actor,
            namespace=namespace,
        )

    def request(self, http: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
        """The `httpx.Request` for `call`, built by the client that will send it."""
        headers = {"Accept": f"{JSON}, application/problem+json", "User-Agent": USER_AGENT}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.actor:
            headers["Starbridge-Actor"] = self.actor
        content: bytes | None = None
        if call.text is not None:
            content = call.text.encode()
            headers["Content-Type"] = call.content_type or YAML
        elif call.has_body:
            content = dumps(call.body)
            headers["Content-Type"] = JSON
        query: list[tuple[str, str | int | float | bool | None]] = list(call.query)
        if call.namespaced and self.namespace:
            query.append(("namespace", self.namespace))
        timeout = httpx.USE_CLIENT_DEFAULT if call.timeout is None else httpx.Timeout(call.timeout)
        return http.build_request(
            call.method,
            self.base_url + call.path,
            params=tuple(query),
            headers=headers,
            content=content,
            timeout=timeout,
        )


def decode(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer (`None` when it has no body, the text of a non-JSON one), or
    `ProblemError` for any other status."""
    if not response.is_success:
        raise ProblemError(problem_from_answer(response.status_code, response.reason_phrase, response.content))
    if not response.content:
        return None
    if response.headers.get("content-type", "").split(";")[0].strip().endswith("json"):
        return response.json()
    return response.text
