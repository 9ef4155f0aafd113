"""The real API client and httpx client against a scripted hostile server on loopback:
a dripping body meets the total deadline, a bad certificate is `tls`, and proxies never see
plain http."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lta_worker.config import Settings, build_settings, load_settings
from lta_worker.domain import classify
from lta_worker.errors import EnrollmentError
from lta_worker.secret import Secret
from lta_worker.upstream import ApiClient, http_client
from support.hostile import HostileServer, ProxyProbe, Step, json_body, self_signed_tls

from .test_client import LONG_TERM, TOKEN, api_for

pytestmark = pytest.mark.anyio

# A dripping answer is cut at request_timeout (1 s); anything near this bound is a hang.
DEADLINE_BOUND_S = 6.0


def settings_for(url: str, poll: dict[str, Any] | None = None, **service: Any) -> Settings:
    return build_settings(
        {
            "service": {"base_url": url, "auth_url": url, **service},
            "client": {"id": "demo-client"},
            "poll": poll or {},
        }
    )


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer() as running:
        yield running


async def _read(api: ApiClient) -> Any:
    return await api.read("latest-change", TOKEN)


async def _create(api: ApiClient) -> Any:
    return await api.create_token(Secret("user-access-token-abcdef123456"))


async def _drop(api: ApiClient) -> Any:
    return await api.drop(TOKEN)


async def _exchange(api: ApiClient) -> Any:
    return await api.exchange_code(
        Secret("the-code-123456"), Secret("v" * 43), "https://a.example/cb"
    )


@pytest.mark.parametrize(
    ("operation", "path", "failure"),
    [
        pytest.param(_read, "/api/v1/history/latest-change", None, id="read"),
        pytest.param(_create, "/api/long-term-access/tokens", EnrollmentError, id="create-token"),
        pytest.param(_drop, "/api/long-term-access/tokens", None, id="drop"),
        pytest.param(_exchange, "/oidc/token", EnrollmentError, id="exchange-code"),
    ],
)
async def test_a_dripping_body_is_cut_at_the_request_deadline(
    server: HostileServer,
    operation: Callable[[ApiClient], Awaitable[Any]],
    path: str,
    failure: type[Exception] | None,
) -> None:
    """A body dripping a byte every 0.2 s never resets the total deadline (request_timeout)."""
    server.script(path, Step(200, body=json_body({"token": "x" * 200}), drip=0.2))
    settings = settings_for(server.url, read_timeout="5s", request_timeout="1s")
    started = time.monotonic()
    async with http_client(settings.service) as http:
        api = api_for(http, settings)
        if failure is None:
            answer = await operation(api)
            assert (answer.status, answer.error) == (None, "timeout")
            assert classify("latest-change", answer).reason == "network timeout"
        else:
            with pytest.raises(failure, match="timeout"):
                await operation(api)
    assert time.monotonic() - started < DEADLINE_BOUND_S
    assert len(server.requests(path)) == 1


async def test_a_certificate_failure_is_tls_not_connect(tmp_path: Path) -> None:
    """A self-signed certificate fails verification and is classified `tls`."""
    with HostileServer(tls=self_signed_tls(tmp_path)) as tls_server:
        settings = settings_for(tls_server.url)
        async with http_client(settings.service) as http:
            answer = await api_for(http, settings).read("latest-change", TOKEN)
    assert (answer.status, answer.error) == (None, "tls")
    assert classify("latest-change", answer).reason == "tls"


async def test_a_refused_connection_is_still_network_connect() -> None:
    """The control case: nothing listening is `network connect`, not `tls`."""
    with HostileServer() as gone:
        url = gone.url
    settings = settings_for(url, connect_timeout="2s")
    async with http_client(settings.service) as http:
        answer = await api_for(http, settings).read("latest-change", TOKEN)
    assert classify("latest-change", answer).reason == "network connect"


def read_through_env(url: str, env: dict[str, str]) -> Any:
    """Settings loaded from `env` (service at `url`), then one read with the real client."""

    async def read() -> Any:
        service = {"LTA_WORKER_SERVICE_BASE_URL": url, "LTA_WORKER_SERVICE_AUTH_URL": url}
        settings = load_settings(None, {**env, **service, "LTA_WORKER_CLIENT_ID": "demo-client"})
        async with http_client(settings.service) as http:
            return await api_for(http, settings).read("latest-change", TOKEN)

    return read()


PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY")


async def test_plain_http_never_goes_through_a_proxy(
    server: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every proxy variable set, an http loopback read goes straight to the server."""
    server.script("/api/v1/history/latest-change", Step(200, body=b"{}"))
    with ProxyProbe() as probe:
        env = dict.fromkeys(PROXY_VARIABLES, probe.url)
        for name, value in env.items():  # httpx would read these itself if it trusted env
            monkeypatch.setenv(name, value)
        answer = await read_through_env(server.url, env)
    assert answer.status == 200
    assert probe.first_lines == []
    assert server.requests()[0].headers["authorization"] == LONG_TERM


async def test_https_goes_through_the_proxy_as_a_tunnel() -> None:
    """HTTPS_PROXY (`service.https_proxy`) is honoured for https as a CONNECT tunnel: the proxy
    never sees the credential; its refusal is an error answer."""
    with ProxyProbe() as probe:
        answer = await read_through_env("https://api.service.invalid", {"HTTPS_PROXY": probe.url})
    assert answer.status is None
    assert probe.first_lines == ["CONNECT api.service.invalid:443 HTTP/1.1"]
    assert TOKEN.reveal().encode() not in probe.heads[0]


async def test_no_proxy_hosts_are_reached_directly(tmp_path: Path) -> None:
    """A host named in NO_PROXY is reached without the proxy, even over https."""
    with HostileServer(tls=self_signed_tls(tmp_path)) as tls_server, ProxyProbe() as probe:
        env = {"HTTPS_PROXY": probe.url, "NO_PROXY": "localhost, 127.0.0.1"}
        answer = await read_through_env(tls_server.url, env)
    assert answer.error == "tls"  # it reached the server itself (whose certificate is bad)
    assert probe.first_lines == []


@pytest.mark.parametrize("operation", [_read, _create, _drop, _exchange])
async def test_a_cookie_the_service_sets_is_never_sent_back(
    server: HostileServer, operation: Callable[[ApiClient], Awaitable[Any]]
) -> None:
    """A Set-Cookie in one answer is never sent back (the service cannot tie users together)."""
    cookie = ("Set-Cookie", "session=user-a-0123456789; Path=/")
    server.default = Step(200, [cookie, ("Content-Type", "application/json")], json_body({}))
    settings = settings_for(server.url)
    async with http_client(settings.service) as http:
        api = api_for(http, settings)
        await _read(api)
        with contextlib.suppress(EnrollmentError):  # `{}` is no token: fine
            await operation(api)
    later = server.requests()[1:]
    assert later
    assert all("cookie" not in {k.lower() for k in seen.headers} for seen in later)


async def test_the_client_keeps_at_most_a_connection_per_turn_plus_one() -> None:
    """Concurrent reads keep at most `poll.concurrency` + 1 connections; sequential reuse one."""
    accepted = 0
    body = json_body({"ok": True})
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while await reader.readuntil(b"\r\n\r\n"):
                await asyncio.sleep(0.01)  # long enough for the others to want a connection
                writer.write(answer)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    settings = settings_for(url, {"concurrency": 2})
    concurrency = settings.poll.concurrency
    async with server, http_client(settings.service, concurrency=concurrency) as http:
        api = api_for(http, settings)
        for _ in range(3):
            assert (await _read(api)).status == 200
        assert accepted == 1
        answers = await asyncio.gather(*(_read(api) for _ in range(12)))
    assert [a.status for a in answers] == [200] * 12
    assert accepted <= settings.poll.concurrency + 1


async def test_reads_cut_at_their_deadline_give_their_connection_back(
    server: HostileServer,
) -> None:
    """Reads cut at `request_timeout` give their connections back: the next read is answered."""
    slow = Step(200, body=json_body({}), delay=3.0)
    stalling = True
    server.respond = lambda seen: slow if stalling else None
    settings = settings_for(server.url, {"concurrency": 1}, request_timeout="1s")  # two at a time
    async with http_client(settings.service) as http:
        api = api_for(http, settings)
        cut = await asyncio.gather(*(_read(api) for _ in range(3)))
        assert [(a.status, a.error) for a in cut] == [(None, "timeout")] * 3
        stalling = False
        answer = await _read(api)
    assert answer.status == 200
