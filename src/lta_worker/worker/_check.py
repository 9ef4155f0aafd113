"""`check`: every precondition of `run` and `serve`, each checked whatever the others found,
writing nothing (docs/operations.md, *Checking an installation*).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lta_worker.errors import ConfigError, UpstreamError

if TYPE_CHECKING:
    import httpx

    from lta_worker.config import Settings
    from lta_worker.runtime import Runtime
    from lta_worker.storage import Vault


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: its name, what it found, and the error when it failed."""

    name: str
    detail: str
    error: BaseException | None = None


_SECRET_DETAILS: dict[str, Callable[[Settings], str]] = {
    "client_secret": lambda s: f"{s.client.secret_file}: readable, one line",
    "webhook_secret": lambda s: f"{s.webhook.secret_file}: readable, a whsec_ secret",
    "enroll_link_key": lambda s: f"{s.enroll.link_key_file}: readable, one key per line",
}


def _keys_open_what_is_stored(runtime: Runtime, vault: Vault) -> None:
    """Decrypt one stored secret under each listed key id: other keys under the right ids fail."""
    try:
        samples = runtime.store.one_secret_per_key_id(runtime.clock.now())
    except Exception:  # the database check reports it
        return
    for sample in samples:
        if sample.secret.key_id in vault.key_ids:
            vault.decrypt(sample.secret, user=sample.user, purpose=sample.kind)


def _database(runtime: Runtime, vault: Vault | None) -> str:
    from lta_worker.storage import HEAD_REVISION, require_sqlite_writable

    store = runtime.store
    users = sum(store.count_by_state().values())
    in_use = store.key_ids_in_use(runtime.clock.now())
    if store.database.path is not None:
        require_sqlite_writable(store.database.path)
    if vault is not None:
        vault.require_keys(in_use)
    return f"{store.dialect}, schema at revision {HEAD_REVISION}, {users} user(s)"


async def _service(runtime: Runtime) -> str:
    # A GET of a read path without a credential: a 404 says `service.base_url` is wrong
    # (else first seen as a `run` stopped by the breaker). A HEAD of `service.auth_url`.
    import httpx

    from lta_worker.upstream import READ_PATHS, join_url

    service, http = runtime.settings.service, runtime.http
    read_url = join_url(service.base_url, READ_PATHS["stats"])
    answers: list[str] = []
    for method, url in (("GET", read_url), ("HEAD", service.auth_url + "/")):
        try:
            response = await http.request(method, url)
        except httpx.HTTPError as exc:
            raise UpstreamError(
                f"{url} cannot be reached ({type(exc).__name__})",
                hint="check service.base_url / service.auth_url, DNS, the firewall "
                "and service.https_proxy",
            ) from None
        if url == read_url and response.status_code == 404:
            raise ConfigError(
                f"{read_url} answered HTTP 404 to a GET without credentials (a read path "
                "answers 401): there is no read endpoint under this base URL",
                key="service.base_url",
                hint="set service.base_url to the API's root, without /api/v1 or a "
                f"version (reads go to {{base_url}}{READ_PATHS['stats']})",
            )
        answers.append(f"{method} {url} answered HTTP {response.status_code}")
    return "; ".join(answers)


async def run_checks(
    settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None
) -> list[CheckResult]:
    """Run every check; none writes anything or spends the read budget."""
    from lta_worker.runtime import Runtime

    results: list[CheckResult] = []
    async with Runtime(settings, read_only=True, transport=transport) as runtime:
        for name, read in runtime.secret_files().items():
            try:
                read()
                results.append(CheckResult(name, _SECRET_DETAILS[name](settings)))
            except Exception as exc:
                results.append(CheckResult(name, "unusable", exc))
        vault: Vault | None = None
        try:
            vault = runtime.vault
            _keys_open_what_is_stored(runtime, vault)
            detail = f"{len(vault.key_ids)} key(s), newest {vault.current_key_id}"
            results.append(CheckResult("key_file", detail))
        except Exception as exc:
            results.append(CheckResult("key_file", "unusable", exc))
        try:
            results.append(CheckResult("database", _database(runtime, vault)))
        except Exception as exc:
            results.append(CheckResult("database", "unusable", exc))
        try:
            results.append(CheckResult("service", await _service(runtime)))
        except Exception as exc:
            results.append(CheckResult("service", "unreachable", exc))
    listeners = (
        ("metrics.listen", settings.metrics.listen),
        ("enroll.listen", settings.enroll.listen),
    )
    for key, listen in listeners:
        if listen:
            results.append(_listen(key, listen))
    return results


def _listen(key: str, listen: str) -> CheckResult:
    """Bind `listen` as `serve` will and let it go at once: taken, `serve` would exit 78."""
    from lta_worker.worker._listen import listen_socket

    name = key.replace(".", "_")
    try:
        listen_socket(listen, key=key).close()
    except ConfigError as exc:
        return CheckResult(name, "unusable", exc)
    return CheckResult(name, f"{listen}: free")
