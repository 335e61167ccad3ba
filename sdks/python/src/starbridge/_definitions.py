"""What `Client.apply` sends: a workflow definition given as a file path, a YAML or JSON text, or
a dict, and the name to apply it under (`PUT /api/v1/workflows/{name}`).

The server reads the definition itself (YAML 1.2 or JSON, whatever the `Content-Type`), so the
SDK needs no YAML parser: text is sent as it is. Only the name must be known before sending; it is
taken from the caller, a dict's or JSON text's `name`, the top-level `name:` line of a YAML block
mapping, or else a file's stem, as `starbridge apply` does. The server checks that the document's
`name` matches (else `422` naming `name`), so a name guessed wrong is refused, never misapplied.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Union

Definition = Union[str, "os.PathLike[str]", Mapping[str, Any]]

# A top-level `name:` key of a YAML block mapping (column 0), with an optional quoted value and
# an optional trailing comment.
_YAML_NAME = re.compile(
    r"""^name[ \t]*:[ \t]*(?:"(?P<double>[^"\\]*)"|'(?P<single>[^']*)'|(?P<plain>[^#'"\s][^#]*?))[ \t]*(?:\#.*)?$""",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Document:
    """A definition ready to send: its name and either its text or its JSON object."""

    name: str
    text: str | None = None
    mapping: Mapping[str, Any] | None = None


def read(definition: Definition, name: str | None) -> Document:
    """The document `definition` stands for, named `name` or by what it says."""
    if isinstance(definition, Mapping):
        found = definition.get("name")
        chosen = name or (found if isinstance(found, str) else None)
        if not chosen:
            raise ValueError("the definition has no 'name': pass name=")
        return Document(name=chosen, mapping=definition)
    path = _as_path(definition)
    if path is None:
        text = str(definition)
        stem = None
    else:
        text = path.read_text(encoding="utf-8")
        stem = path.stem
    chosen = name or name_in_text(text) or stem
    if not chosen:
        raise ValueError("cannot tell the workflow's name from the definition: pass name=")
    return Document(name=chosen, text=text)


def _as_path(definition: str | os.PathLike[str]) -> Path | None:
    """`definition` as a file path, when it is one: a `PathLike`, or a one-line string naming
    an existing file."""
    if isinstance(definition, os.PathLike):
        return Path(definition)
    if "\n" not in definition and len(definition) < 4096 and Path(definition).is_file():
        return Path(definition)
    return None


def name_in_text(text: str) -> str | None:
    """The top-level `name` of a JSON object text, or of a YAML block mapping; `None` when the
    text says none this reading can find."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            return None
        found = parsed.get("name") if isinstance(parsed, dict) else None
        return found if isinstance(found, str) else None
    match = _YAML_NAME.search(text)
    if match is None:
        return None
    return match.group("double") or match.group("single") or match.group("plain")
