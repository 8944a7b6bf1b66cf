"""The Secrets a user creates before applying the manifest, made up for the local cluster.

Every `secretKeyRef` of the manifest resolves (manifest.load reads env values through this mapping),
and a Secret volume becomes files per pod under the work folder, as the kubelet mounts them.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Optional

#: The API keys' Secret (k8s/; the RayServices mount it and read it as a file).
API_KEY_SECRET = "serve-app-api-key"


class UserSecrets(dict):
    def __init__(self, api_key: Optional[str] = None):
        super().__init__()
        self.api_key = api_key or secrets.token_urlsafe(32)
        self.redis_password = secrets.token_urlsafe(24)
        #: (Secret, key) of gcsFaultToleranceOptions' Redis password, once the manifest is read
        self.gcs_password_ref: Optional[tuple[str, str]] = None
        self._made: dict[tuple[str, str], str] = {}

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2

    def __getitem__(self, key: tuple[str, str]) -> str:
        return self.value(*key)

    def value(self, name: str, key: str) -> str:
        if name == API_KEY_SECRET:
            return self.api_key
        if self.gcs_password_ref == (name, key) or name.endswith("redis"):
            return self.redis_password
        return self._made.setdefault((name, key), secrets.token_urlsafe(32))

    def mounted(self, secret_mounts: dict[str, str], pod: str, value: str, workdir: Path) -> str:
        """`value`, with a path into a Secret volume (mount path -> Secret) moved to pod `pod`'s copy
        of that file under `workdir`."""
        for mount, secret_name in secret_mounts.items():
            if value.startswith(mount.rstrip("/") + "/"):
                key = value[len(mount.rstrip("/")) + 1:]
                local = workdir / "secrets" / pod / secret_name / key
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(self.value(secret_name, key))
                local.chmod(0o440)
                return str(local)
        return value
