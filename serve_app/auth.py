"""API keys: where they come from, which are refused, and who a request is.

Keys come from the environment (`SERVE_APP_INGRESS_API_KEYS`, comma-separated) or from a file
(`SERVE_APP_INGRESS_API_KEYS_FILE`: a mounted Kubernetes Secret), never from the Serve config's
`args:` or a runtime_env (the dashboard and `serve config` print those): `reject_secrets_in_args` and
config_check refuse them there, and the Redis password with them. The file is read again when it
changes (a Secret volume swaps it in place on rotation), so a new key works and a removed one stops
working without a redeploy.

Fail closed (`startup_check`, run by the builder and by every Ingress replica): a service that
listens on anything but a loopback address refuses to start without a key, unless
`ingress.auth_disabled` says, by name, that something in front does the authentication; a key
shorter than KEY_MIN_CHARS or one that looks like a placeholder is refused. Errors name the
problem and which key (by position and source), never the key itself.

A request's identity is its key's id (`key_id`: a hash prefix, not the key): the response cache
is partitioned by it and the job store scopes jobs with it (middleware.API_KEY_ID_STATE).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

logger = logging.getLogger("serve_app")

#: shortest key accepted: 32 characters (`openssl rand -hex 32` gives 64)
KEY_MIN_CHARS = 32
#: keys containing one of these (case-insensitive) are placeholders someone forgot to replace
PLACEHOLDER_MARKERS = ("placeholder", "changeme", "change-me", "change_me", "replace", "example",
                       "not-a-real", "notareal", "your-key", "your_key", "yourkey", "dummy", "insecure")
#: fewer distinct characters than this is no secret ("aaaa...", "0000...")
KEY_MIN_DISTINCT_CHARS = 8
#: how often (at most) the keys file's metadata is looked at, seconds
KEYS_FILE_CHECK_INTERVAL_S = 1.0
GENERATE_HINT = "generate one with `openssl rand -hex 32`"

#: The key id (`key_id`) of the request being handled, set by middleware.ApiKeyAuth for the
#: request's task (and the tasks it starts); None when keys are off. The response cache is
#: partitioned by it.
REQUEST_KEY_ID: ContextVar[Optional[str]] = ContextVar("serve_app_request_key_id", default=None)


class AuthConfigError(ValueError):
    """The API-key configuration is unsafe or unreadable; the message never contains a key."""


def key_id(key: str) -> str:
    """A key's identity for caches, jobs and logs: 16 hex digits of its SHA-256 (not reversible)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def parse_keys(text: str) -> list[str]:
    """Keys separated by commas or newlines; blank lines and `#` comment lines are skipped."""
    keys = []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        keys += [k.strip() for k in line.split(",") if k.strip()]
    return keys


def key_problems(keys: Sequence[str], source: str) -> list[str]:
    """Why each unsafe key is refused, naming it by position in `source`, never by value."""
    problems = []
    for n, key in enumerate(keys, 1):
        which = f"{source}: key {n} of {len(keys)}"
        lowered = key.lower()
        marker = next((m for m in PLACEHOLDER_MARKERS if m in lowered), None)
        if marker:
            problems.append(f"{which} contains {marker!r}: it is a placeholder, not a secret; {GENERATE_HINT}")
        elif len(key) < KEY_MIN_CHARS:
            problems.append(f"{which} is {len(key)} characters long; at least {KEY_MIN_CHARS} are required; "
                            f"{GENERATE_HINT}")
        elif len(set(key)) < KEY_MIN_DISTINCT_CHARS:
            problems.append(f"{which} has only {len(set(key))} distinct characters; {GENERATE_HINT}")
        if re.search(r"\s", key):
            problems.append(f"{which} contains whitespace")
        elif not (key.isascii() and key.isprintable()):  # a header carries it as bytes, read back as latin-1
            problems.append(f"{which} has characters other than printable ASCII, which no client sends as is")
    return problems


@dataclass(frozen=True)
class KeySet:
    """The accepted keys as (SHA-256 digest, key id) pairs: the keys themselves are not kept."""

    entries: tuple[tuple[bytes, str], ...]

    @classmethod
    def of(cls, keys: Sequence[str]) -> "KeySet":
        unique = dict.fromkeys(keys)
        return cls(tuple((hashlib.sha256(k.encode("utf-8")).digest(), key_id(k)) for k in unique))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def identify(self, presented: str) -> Optional[str]:
        """The id of the key `presented` is, or None. Constant-time: equal-length digests, each
        compared, no early exit."""
        digest = hashlib.sha256(presented.encode("utf-8", "surrogatepass")).digest()
        found = None
        for known, ident in self.entries:
            if hmac.compare_digest(digest, known):
                found = ident
        return found


class KeysFile:
    """The keys in a file, read again whenever its metadata changes (checked at most every
    `interval_s`). A Kubernetes Secret volume replaces the file by swapping a symlink, which
    changes the inode and mtime that `os.stat` sees through the link.

    A file that turns unreadable, empty or unsafe after a good read keeps the last good keys
    (an error is logged): a bad rotation neither opens the service nor locks every client out.
    The first read raises instead (start-up refuses)."""

    def __init__(self, path: str, *, interval_s: float = KEYS_FILE_CHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.interval_s = interval_s
        self._clock = clock
        self._checked_at = float("-inf")
        self._signature: Optional[tuple] = None
        self._keys: Optional[KeySet] = None
        self.reloads = 0

    def keys(self) -> KeySet:
        now = self._clock()
        if self._keys is not None and now - self._checked_at < self.interval_s:
            return self._keys
        self._checked_at = now
        try:
            stat = os.stat(self.path)
            signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if signature != self._signature:
                self._keys, self._signature = self._read(), signature
                self.reloads += 1
        except (OSError, AuthConfigError) as exc:
            if self._keys is None:
                raise AuthConfigError(str(exc)) from None
            logger.error("API keys file %s: %s; keeping the %d keys read before", self.path, exc, len(self._keys))
        return self._keys

    def _read(self) -> KeySet:
        source = f"ingress.api_keys_file {self.path!r}"
        try:  # (utf-8-sig: a byte-order mark an editor wrote is not part of the first key)
            with open(self.path, encoding="utf-8-sig") as f:
                keys = parse_keys(f.read())
        except UnicodeDecodeError as exc:
            raise AuthConfigError(f"{source} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if not keys:
            raise AuthConfigError(f"{source} holds no key")
        problems = key_problems(keys, source)
        if problems:
            raise AuthConfigError("; ".join(problems))
        return KeySet.of(keys)


_FILES: dict[str, KeysFile] = {}


def configured_keys(settings: Any) -> KeySet:
    """Every key `settings` (IngressSettings) accepts: its env keys and its keys file's current
    contents (one KeysFile per path per process)."""
    keys = list(settings.api_key_list())
    path = settings.api_keys_file
    env_keys = _env_key_set(tuple(keys))
    if not path:
        return env_keys
    if path not in _FILES:
        _FILES[path] = KeysFile(path)
    from_file = _FILES[path].keys()
    return KeySet(env_keys.entries + tuple(e for e in from_file.entries if e not in env_keys.entries))


_ENV_KEY_SETS: dict[tuple[str, ...], KeySet] = {}


def _env_key_set(keys: tuple[str, ...]) -> KeySet:
    if keys not in _ENV_KEY_SETS:
        _ENV_KEY_SETS.clear()  # one list at a time: settings rarely change in a process
        _ENV_KEY_SETS[keys] = KeySet.of(keys)
    return _ENV_KEY_SETS[keys]


# --- start-up: fail closed ------------------------------------------------------------------------

def is_loopback(host: Optional[str]) -> bool:
    """127.0.0.0/8, ::1 and `localhost` reach only this machine; anything else (0.0.0.0, ::, a pod
    IP, a host name) may be reachable from elsewhere."""
    if host is None:
        return False
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def startup_check(settings: Any, host: Optional[str]) -> None:
    """Raise AuthConfigError when `settings` (IngressSettings) may not serve on `host` (None: not
    known, i.e. not running under Serve; only the keys are checked then)."""
    problems = key_problems(settings.api_key_list(), "SERVE_APP_INGRESS_API_KEYS (ingress.api_keys)")
    if problems:
        raise AuthConfigError("Refusing to start: " + "; ".join(problems))
    try:
        keys = configured_keys(settings)
    except AuthConfigError as exc:
        raise AuthConfigError(f"Refusing to start: {exc}") from None
    if settings.auth_disabled and keys:
        raise AuthConfigError("Refusing to start: ingress.auth_disabled is true but API keys are configured; "
                              "unset one of SERVE_APP_INGRESS_AUTH_DISABLED and the keys")
    if host is not None and not keys and not settings.auth_disabled and not is_loopback(host):
        raise AuthConfigError(
            f"Refusing to start: the service listens on {host!r} (http_options.host), reachable from other "
            "machines, and no API key is configured. Set SERVE_APP_INGRESS_API_KEYS_FILE to a mounted Secret "
            "file (or SERVE_APP_INGRESS_API_KEYS) with keys of at least "
            f"{KEY_MIN_CHARS} characters, or SERVE_APP_INGRESS_AUTH_DISABLED=true when something in front "
            "authenticates every request, or listen on 127.0.0.1.")
    if host is not None and settings.auth_disabled and not is_loopback(host):
        logger.warning("API keys are off (ingress.auth_disabled) on %r: anyone who reaches the port may call "
                       "every route", host)


def serve_http_host() -> Optional[str]:
    """The host Serve's HTTP proxies listen on (http_options.host), asked of the running Serve
    controller; None outside a Ray cluster with Serve (unit tests build apps without one)."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        try:
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        except ValueError:
            return None
        return ray.get(controller.get_http_config.remote(), timeout=30).host
    except Exception as exc:  # pragma: no cover - then fail closed below
        raise AuthConfigError(f"Refusing to start: could not ask Serve which host it listens on ({exc!r})")


def reject_secrets_in_args(args: Optional[Mapping[str, Any]]) -> None:
    """API keys and the Redis password in the Serve config's `args:` are refused (nested or dotted):
    `serve config`, the dashboard and the RayService object show args to whoever can read them."""
    def folded(mapping: Mapping[str, Any]) -> dict[str, Any]:  # pydantic-settings matches names in any case
        return {str(name).casefold(): value for name, value in mapping.items()}

    args = folded(args or {})
    for (section, field), where_instead in SECRETS.items():
        nested = args.get(section)
        if f"{section}.{field}" in args or (isinstance(nested, Mapping) and field in folded(nested)):
            raise AuthConfigError(f"args.{section}.{field}: {_NOT_IN_CONFIG}; set {where_instead}")


def reject_secrets_in_env_vars(env_vars: Any, where: str) -> list[str]:
    """The same secrets set in a runtime_env's `env_vars` (printed with the rest of the config)."""
    names = {f"SERVE_APP_{section.upper()}_{field.upper()}" for section, field in SECRETS}
    # (pydantic-settings reads the environment regardless of case)
    found = sorted(n for n in env_vars if str(n).upper() in names) if isinstance(env_vars, Mapping) else []
    return [f"{where}.env_vars.{name}: {_NOT_IN_CONFIG}; set it in the process environment or use "
            f"{name}_FILE (a mounted Secret)" for name in found]


_NOT_IN_CONFIG = "secrets must not be in the Serve config (the dashboard and `serve config` print it)"

#: secret settings -> where they go instead
SECRETS = {
    ("ingress", "api_keys"): "SERVE_APP_INGRESS_API_KEYS_FILE (a mounted Secret) or SERVE_APP_INGRESS_API_KEYS",
    ("jobs", "redis_password"): "SERVE_APP_JOBS_REDIS_PASSWORD_FILE (a mounted Secret) or SERVE_APP_JOBS_REDIS_PASSWORD",
}
