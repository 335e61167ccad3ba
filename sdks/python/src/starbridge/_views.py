"""`View`: a thin, read-only attribute wrapper over a JSON object the server answered, so that
`job.id`, `job.tasks[0].status` and `job["id"]` all work, and fields a newer server adds are
there without an SDK release. `to_dict()` gives the plain JSON back."""

from __future__ import annotations

from typing import Any, Iterator


def wrap(value: Any) -> Any:
    """JSON objects become `View`s (also inside lists); everything else is returned as is."""
    if isinstance(value, dict):
        return View(value)
    if isinstance(value, list):
        return [wrap(item) for item in value]
    return value


class View:
    """A JSON object of an API answer, read by attribute or by key.

    The field names are those of docs/reference.md (section 4): a job view has `id`, `status`,
    `tasks`, …; a task view `step`, `attempt`, `output`, `error`, …. A missing attribute raises
    `AttributeError`, a missing key `KeyError`; `get` takes a default.
    """

    __slots__ = ("_data",)
    _data: dict[str, Any]

    def __init__(self, data: dict[str, Any]) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return wrap(self._data[name])
        except KeyError:
            raise AttributeError(
                f"this view has no field {name!r}; it has {', '.join(sorted(self._data)) or 'none'}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("views are read-only: change the dict of to_dict() instead")

    def __getitem__(self, key: str) -> Any:
        return wrap(self._data[key])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str, default: Any = None) -> Any:
        """The field `key`, or `default` when the view has none."""
        return wrap(self._data[key]) if key in self._data else default

    def to_dict(self) -> dict[str, Any]:
        """The JSON object itself (not a copy)."""
        return self._data

    def __eq__(self, other: object) -> bool:
        if isinstance(other, View):
            return self._data == other._data
        if isinstance(other, dict):
            return self._data == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"View({self._data!r})"
