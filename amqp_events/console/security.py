"""Who may use the console, and as what: pure rules, no I/O.

* On a loopback address without any credentials configured, everyone who can
  reach it (this machine's users) is an operator. On any other address the
  console refuses to start without credentials.
* Credentials come from the environment: ``AMQP_EVENTS_CONSOLE_USERS``, a
  comma-separated list of ``name:role:hash`` (the hash made by
  ``amqp-events console hash-password``, PBKDF2-SHA256), for browsers
  (HTTP Basic); ``AMQP_EVENTS_CONSOLE_TOKEN`` (operator) and
  ``AMQP_EVENTS_CONSOLE_READ_TOKEN`` (read-only), for scripts
  (``Authorization: Bearer ...``).
* Roles: ``read`` sees everything; ``operator`` may also change things
  (replay, purge, pause and resume).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from amqp_events.environment import variable

READ, OPERATOR = "read", "operator"
ROLES = (READ, OPERATOR)
#: PBKDF2 rounds of a new password hash (OWASP's advice for PBKDF2-SHA256).
ROUNDS = 600_000
ENVIRONMENT = ("AMQP_EVENTS_CONSOLE_USERS", "AMQP_EVENTS_CONSOLE_TOKEN", "AMQP_EVENTS_CONSOLE_READ_TOKEN")


@dataclass(frozen=True)
class Who:
    """Whoever made a request, and what they may do."""

    name: str
    role: str
    #: Let in by a bearer token the console knows: a script, which sends no cookie, so needs no CSRF token.
    by_token: bool = False

    @property
    def may_change(self) -> bool:
        return self.role == OPERATOR


@dataclass(frozen=True)
class Access:
    """The console's credentials: users by name (role, password hash) and tokens (role by token)."""

    users: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    tokens: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Access:
        users = {}
        for entry in filter(None, (part.strip() for part in (variable(ENVIRONMENT[0], environ) or "").split(","))):
            name, role, password_hash = _user_entry(entry)
            users[name] = (role, password_hash)
        tokens = {
            token: role
            for token, role in (
                (variable(ENVIRONMENT[1], environ), OPERATOR),
                (variable(ENVIRONMENT[2], environ), READ),
            )
            if token
        }
        return cls(users, tokens)

    @property
    def configured(self) -> bool:
        return bool(self.users or self.tokens)

    def who(self, authorization: str | None, loopback: bool) -> Who | None:
        """Who sent a request with this ``Authorization`` header (``None``: nobody the console knows)."""
        if not self.configured:
            return Who("local", OPERATOR) if loopback else None
        holder = self.token_holder(authorization)
        if holder is not None:
            return holder
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() == "basic":
            try:
                name, _, password = base64.b64decode(credentials.strip()).decode("utf-8").partition(":")
            except ValueError:
                return None
            # An unknown name costs the same PBKDF2 as a known one: the time taken does not tell which names exist.
            role, password_hash = self.users.get(name, (READ, UNKNOWN_USER_HASH))
            if password_matches(password, password_hash) and name in self.users:
                return Who(name, role)
        return None

    def token_holder(self, authorization: str | None) -> Who | None:
        """Who sent a bearer token the console knows, if that is what ``authorization`` is (a compare, no hash)."""
        scheme, _, credentials = (authorization or "").partition(" ")
        if scheme.lower() == "bearer":
            for token, role in self.tokens.items():
                if hmac.compare_digest(token.encode(), credentials.strip().encode()):
                    return Who("token", role, by_token=True)
        return None


class LoginThrottle:
    """Logins per client that failed or are still being checked: once ``limit`` of them are less than ``window``
    seconds old, that client's next ones are refused unchecked (a password cannot be guessed at the speed of
    the machine, nor by sending many at once: a login counts from when it arrives, not from its answer)."""

    def __init__(self, limit: int = 10, window: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self._attempts: dict[str, deque[float]] = {}

    def attempt(self, client: str) -> float | None:
        """Count a login of ``client`` as failed from now on, until :meth:`succeeded` says otherwise, and return
        when it started; ``None``: refused, ``client`` has had its ``limit`` already."""
        now = self.clock()
        attempts = self._attempts.get(client)
        if attempts is None:
            if len(self._attempts) >= 10_000:  # bounded: a flood of addresses forgets the oldest first
                self._attempts.pop(next(iter(self._attempts)))
            attempts = self._attempts[client] = deque()
        while attempts and attempts[0] <= now - self.window:
            attempts.popleft()
        if len(attempts) >= self.limit:
            return None
        attempts.append(now)
        return now

    def succeeded(self, client: str, started: float) -> None:
        """The login of ``client`` that :meth:`attempt` counted at ``started`` was right: it does not count."""
        attempts = self._attempts.get(client)
        if attempts is not None and started in attempts:  # else already older than the window
            attempts.remove(started)
            if not attempts:
                del self._attempts[client]


def allowed_hosts(bind_host: str, names: Iterable[str] = ()) -> list[str]:
    """The ``Host`` headers the console answers: the address it listens on (and ``localhost`` on loopback) and
    the names it is reached by; any other is refused first (DNS rebinding). On a wildcard address without
    names, any (it requires credentials there)."""
    host = bind_host.strip("[]")
    given = [name.strip() for name in names if name.strip()]
    if host in ("0.0.0.0", "::"):
        return given or ["*"]
    local = ["localhost", "127.0.0.1", "::1", "[::1]"] if is_loopback(host) else []
    return [*dict.fromkeys([host, f"[{host}]" if ":" in host else host, *local, *given])]


def refuses_to_start(host: str, access: Access) -> str | None:
    """Why the console must not listen on ``host`` with ``access``, if it must not."""
    if access.configured or is_loopback(host):
        return None
    return (
        f"the console would listen on {host}, which is not a loopback address, without authentication: set "
        f"{ENVIRONMENT[0]} (users made with `amqp-events console hash-password`) or {ENVIRONMENT[1]}"
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def hash_password(password: str, rounds: int = ROUNDS) -> str:
    """``pbkdf2_sha256$ROUNDS$SALT$HASH``: what ``AMQP_EVENTS_CONSOLE_USERS`` keeps instead of a password."""
    salt = secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt.encode(), rounds)
    return f"pbkdf2_sha256${rounds}${salt}${digest.hex()}"


def password_matches(password: str, password_hash: str) -> bool:
    try:
        algorithm, rounds, salt, expected = password_hash.split("$")
        digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt.encode(), int(rounds))
    except ValueError:
        return False
    return algorithm == "pbkdf2_sha256" and hmac.compare_digest(digest.hex(), expected)


#: What an unknown user's password is checked against (it matches no password anyone could send).
UNKNOWN_USER_HASH = f"pbkdf2_sha256${ROUNDS}$unknown-user${'0' * 64}"


def csrf_token() -> str:
    """A new token for a browser: kept in its cookie, sent back with every change (double submit)."""
    return secrets.token_urlsafe(32)


def csrf_matches(cookie: str | None, sent: str | None) -> bool:
    return bool(cookie and sent) and hmac.compare_digest(str(cookie), str(sent))


def _user_entry(entry: str) -> tuple[str, str, str]:
    name, _, rest = entry.partition(":")
    role, _, password_hash = rest.partition(":")
    if not name or role not in ROLES or not password_hash.startswith("pbkdf2_sha256$"):
        raise ValueError(
            f"{ENVIRONMENT[0]}: {name or entry!r} is not name:role:hash (role one of {', '.join(ROLES)}, the hash "
            "made by `amqp-events console hash-password`)"
        )
    return name, role, password_hash
