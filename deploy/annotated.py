"""Values with their reasons: the vocabulary of deploy/serve_profiles.py.

A profile is nested dicts and lists whose values may be `Why(value, reason)`; the reason becomes a
comment above the key in the rendered YAML (deploy/render_configs.py). `merge` lays one profile
over another, `plain` strips the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Why:
    """A value with the reason for it; the reason becomes a comment in the rendered YAML."""

    value: Any
    why: str


#: An override value that removes the key from the profile it overrides.
DROP = object()


def unwrap(value: Any) -> tuple[Any, str | None]:
    return (value.value, value.why) if isinstance(value, Why) else (value, None)


def merge(base: Any, override: Any) -> Any:
    """Deep-merge dicts (the override wins); a Why keeps the override's reason, else the base's."""
    bval, bwhy = unwrap(base)
    oval, owhy = unwrap(override)
    if isinstance(bval, dict) and isinstance(oval, dict):
        merged = dict(bval)
        for key, value in oval.items():
            if value is DROP:
                merged.pop(key, None)
            else:
                merged[key] = merge(bval[key], value) if key in bval else value
        value = merged
    else:
        value = oval
    why = owhy or (bwhy if isinstance(bval, dict) and isinstance(oval, dict) else None)
    return Why(value, why) if why else value


def plain(obj: Any) -> Any:
    """The config without its reasons: plain dicts, lists and scalars."""
    obj, _ = unwrap(obj)
    if isinstance(obj, dict):
        return {key: plain(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [plain(item) for item in obj]
    return obj
