"""Opening a search's Optuna storage so that it survives a cluster: checked before anything
heavy starts, retried through outages, with heartbeats on.

    storage = open_storage("postgresql://user@db/optuna", StorageOptions(heartbeat_interval=30))
    # an RDBStorage whose connections are checked before use (pool_pre_ping), with a connect
    # timeout, heartbeats every 30 s, and every call retried through transient faults for
    # `storage_retry_timeout` seconds before a `StorageError` naming `storage` is raised

A URL becomes an `RDBStorage`; a ready storage object (RDB or Journal) is kept, its calls wrapped
the same way (an `RDBStorage` without heartbeats gets fitkit's, unless they are turned off).
Opening retries the table-creation race of several workers starting on an empty database.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("fitkit")

#: Default seconds between a running trial's heartbeats (`heartbeat_interval`).
HEARTBEAT_INTERVAL = 60
#: Default grace period, in heartbeat intervals: a RUNNING trial silent this long is stale.
GRACE_INTERVALS = 3
#: Default seconds a storage fault is retried before the search fails (`storage_retry_timeout`).
RETRY_TIMEOUT = 60.0
#: Default seconds to wait for a database connection (`storage_connect_timeout`).
CONNECT_TIMEOUT = 10

# The storage calls a search makes (through Optuna's cache or directly); each is retried as a whole.
_CALLS = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "get_study_id_from_name",
    "get_study_name_from_id", "get_study_directions", "get_study_user_attrs", "get_study_system_attrs",
    "get_all_studies", "create_new_trial", "_create_new_trial", "set_trial_param", "_set_trial_param",
    "get_trial_param", "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr",
    "set_trial_system_attr", "get_trial_id_from_study_id_trial_number", "get_trial_number_from_id", "get_trial",
    "get_all_trials", "_get_trials", "get_best_trial", "_get_best_trial_id", "get_n_trials", "get_trial_params",
    "get_trial_user_attrs", "get_trial_system_attrs", "record_heartbeat", "_get_stale_trial_ids",
)


class StorageError(RuntimeError):
    """The search's `storage` could not be reached or used (after retrying for the bound)."""


@dataclass
class StorageOptions:
    """How a search opens its storage (the search options of the same names).

    `heartbeat_interval`: seconds between heartbeats of a running trial (None or 0: off);
    `grace_period`: seconds without one after which a RUNNING trial is stale (default
    `GRACE_INTERVALS` intervals); `storage_retry_timeout`: seconds transient faults are retried
    (0: not retried); `storage_connect_timeout`: seconds to wait for a connection."""

    heartbeat_interval: int | None = HEARTBEAT_INTERVAL
    grace_period: int | None = None
    storage_retry_timeout: float = RETRY_TIMEOUT
    storage_connect_timeout: int = CONNECT_TIMEOUT

    NAMES = ("heartbeat_interval", "grace_period", "storage_retry_timeout", "storage_connect_timeout")

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval", "grace_period"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"`{name}`={value!r} is invalid: pass a whole number of seconds (None or 0: off)")
        for name in ("storage_retry_timeout", "storage_connect_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"`{name}`={value!r} is invalid: pass a number of seconds >= 0")

    @property
    def grace(self) -> int | None:
        if not self.heartbeat_interval:
            return None
        return self.grace_period or GRACE_INTERVALS * self.heartbeat_interval


def open_storage(storage: Any, options: StorageOptions, on_stale: Callable | None = None) -> Any:
    """`storage` (a URL or an Optuna storage) opened, its calls retried, heartbeats set up;
    `on_stale(study, frozen_trial)` runs for each trial found stale (when heartbeats are on).
    Raises `StorageError` (naming `storage` and the server's message) when it cannot be opened."""
    if isinstance(storage, str):
        storage = _retrying_open(lambda: _rdb(storage, options), options, storage)
    _with_heartbeats(storage, options, on_stale)
    return RetryingCalls(options.storage_retry_timeout, describe(storage)).wrap(storage)


def describe(storage: Any) -> str:
    """A storage as an error names it (a URL without its password)."""
    url = getattr(storage, "url", None)
    if isinstance(storage, str) or url:
        try:
            from sqlalchemy.engine import make_url

            return make_url(url or storage).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - not a URL sqlalchemy reads: show it as it is
            return str(url or storage)
    return type(storage).__name__


def _rdb(url: str, options: StorageOptions) -> Any:
    import optuna

    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}  # a connection dropped while idle is replaced
    dialect = url.split(":", 1)[0].split("+", 1)[0]
    if dialect in ("postgresql", "postgres", "mysql", "mariadb"):
        # libpq / MySQL: the whole connection handshake is bounded, so a host that accepts and
        # never answers fails in bounded time instead of hanging (and ignoring Ctrl-C)
        engine_kwargs["connect_args"] = {"connect_timeout": int(max(1, options.storage_connect_timeout))}
    elif dialect == "sqlite":
        engine_kwargs["connect_args"] = {"timeout": max(1, options.storage_connect_timeout)}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except ImportError as error:
        driver = f" (the module {error.__cause__.name!r} is missing)" if isinstance(error.__cause__, ImportError) else ""
        raise ImportError(f"`storage` {describe(url)} needs a database driver{driver}: install it, or name an "
                          "installed one in the URL, e.g. postgresql+psycopg2://... with psycopg2-binary") from error


def _with_heartbeats(storage: Any, options: StorageOptions, on_stale: Callable | None) -> None:
    """Turn on heartbeats of an `RDBStorage` that has none (unless they are off), and route
    stale trials to `on_stale` unless the storage already has a stale-trial callback."""
    if not hasattr(storage, "heartbeat_interval"):  # Journal, in-memory: no heartbeats in Optuna
        return
    if storage.heartbeat_interval is None and options.heartbeat_interval:
        storage.heartbeat_interval = options.heartbeat_interval
        storage.grace_period = options.grace
    if storage.heartbeat_interval and on_stale is not None and storage.heartbeat_stale_trial_callback is None:
        storage.heartbeat_stale_trial_callback = storage.failed_trial_callback = on_stale


def _retrying_open(open_: Callable[[], Any], options: StorageOptions, storage: Any) -> Any:
    """`open_()`, retried while several workers race to create the tables of an empty database
    (a duplicate-key error on PostgreSQL's catalog, a table that "already exists") and while
    the server does not answer, for `storage_retry_timeout` seconds."""
    deadline, delay = time.monotonic() + options.storage_retry_timeout, 0.1
    while True:
        try:
            return open_()
        except Exception as error:
            if not _is_database_error(error):
                raise
            if not (_is_creation_race(error) or is_transient(error)) or time.monotonic() > deadline:
                raise storage_error(error, describe(storage), options.storage_retry_timeout) from error
            logger.info("storage %s not ready (%s); retrying", describe(storage), _server_message(error))
        time.sleep(delay)
        delay = min(2 * delay, 2.0)


def _is_database_error(error: BaseException) -> bool:
    from sqlalchemy import exc

    return any(isinstance(e, exc.SQLAlchemyError) for e in _chain(error))


def _is_creation_race(error: BaseException) -> bool:
    from sqlalchemy import exc

    return any(isinstance(e, (exc.IntegrityError, exc.ProgrammingError)) for e in _chain(error))


def is_transient(error: BaseException) -> bool:
    """A fault worth retrying: the connection failed or was lost (the server down, restarting,
    unreachable), as opposed to a bad query, a bad password or a missing database."""
    from sqlalchemy import exc

    for e in _chain(error):
        if isinstance(e, exc.DBAPIError) and e.connection_invalidated:
            return True
        if isinstance(e, (exc.OperationalError, exc.InterfaceError)):
            message = str(getattr(e, "orig", e)).lower()
            return not any(word in message for word in _PERMANENT)
    return False


# Operational errors that no retry fixes.
_PERMANENT = ("password authentication failed", "does not exist", "no pg_hba.conf entry", "access denied",
              "unknown database", "permission denied", "authentication failed")


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _server_message(error: BaseException) -> str:
    """The database server's (or driver's) own words, not the wrappers around them."""
    from sqlalchemy import exc

    for e in _chain(error):
        if isinstance(e, exc.DBAPIError) and e.orig is not None:
            return " ".join(str(e.orig).split())
    return " ".join(str(error).split()) or type(error).__name__


def storage_error(error: BaseException, name: str, waited: float) -> StorageError:
    retried = f" (retried for {waited:g} s, `storage_retry_timeout`)" if is_transient(error) and waited else ""
    return StorageError(f"`storage` {name} failed{retried}: {_server_message(error)}. Check that the database "
                        "server is up and reachable from this machine, and the URL (user, password, database).")


class RetryingCalls:
    """Wraps a storage's calls: a transient fault is retried with backoff until `timeout`
    seconds have passed since the first failure, then raised as `StorageError`. Once a call
    has given up, later calls try once (the storage is down: no second long wait)."""

    def __init__(self, timeout: float, name: str) -> None:
        self.timeout, self.name = timeout, name
        self.down = False
        self._local = threading.local()  # a call made inside a wrapped call is not retried on its own

    def wrap(self, storage: Any) -> Any:
        if getattr(storage, "_fitkit_retrying", False):
            return storage
        for call in _CALLS:
            method = getattr(storage, call, None)
            if callable(method):
                setattr(storage, call, self._retrying(call, method))
        storage._fitkit_retrying = True
        return storage

    def _retrying(self, name: str, method: Callable) -> Callable:
        @functools.wraps(method)
        def call(*args, **kwargs):
            if getattr(self._local, "inside", False):
                return method(*args, **kwargs)
            self._local.inside = True
            try:
                return self._call(name, method, args, kwargs)
            finally:
                self._local.inside = False

        return call

    def _call(self, name: str, method: Callable, args: tuple, kwargs: dict) -> Any:
        deadline, delay, failed = None, 0.2, False
        while True:
            try:
                result = method(*args, **kwargs)
                self.down = False
                return result
            except Exception as error:
                if failed and name == "set_trial_state_values" and _already_done(error):
                    return True  # the first attempt committed; only its answer was lost
                if not is_transient(error):
                    raise
                now = time.monotonic()
                deadline = deadline or now + (0 if self.down else self.timeout)
                if now >= deadline:
                    self.down = True
                    raise storage_error(error, self.name, self.timeout) from error
                failed = True
                logger.warning("storage %s: %s; retrying", self.name, _server_message(error))
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


def _already_done(error: BaseException) -> bool:
    import optuna

    return isinstance(error, optuna.exceptions.UpdateFinishedTrialError)
