"""The settings table of docs/configuration.md (`python -m serve_app.settings` prints it; test_docs checks it)."""

from __future__ import annotations

from deployments.settings import CustomModelSpec, EmbeddingSettings, TranslationSettings

from .jobs.settings import JobSettings
from .settings import CacheSettings, IngressSettings


def settings_table() -> str:
    """The settings table of docs/configuration.md, generated from the fields above."""
    rows = ["| setting (`args:` key) | env var | default | what it does, how to tune it |",
            "|---|---|---|---|"]
    for section, cls in (("ingress", IngressSettings), ("translation", TranslationSettings),
                         ("embeddings", EmbeddingSettings), ("cache", CacheSettings),
                         ("jobs", JobSettings), ("models[]", CustomModelSpec)):
        prefix = cls.model_config.get("env_prefix", "")
        for name, field in cls.model_fields.items():
            default = field.default_factory() if field.default_factory is not None else field.default
            shown = ("(required)" if field.is_required() else
                     "(none)" if default in (None, [], {}) else f"`{default}`")
            env = f"`{prefix}{name.upper()}`" if prefix else "(`args:` only)"
            description = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{section}.{name}` | {env} | {shown} | {description} |")
    return "\n".join(rows)
