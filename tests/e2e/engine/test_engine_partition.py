"""An engine cut off from its lease registry stops taking requests, then returns under a new generation.

The engine reaches Redis only through a TCP proxy this test controls: severing
it closes every open connection and black-holes new ones (they are accepted
and never answered, as a partition looks from inside), restoring it lets
connections through again.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from common import oneshot_http
from contract.lease import RedisLeaseReader
from tests.support.sse import complete

REDIS = ("127.0.0.1", 6379)
BODY = {"model": "tiny-seed0", "prompt": "Fence the partitioned engine", "max_tokens": 12,
        "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


class SeverableProxy:
    """A TCP proxy on its own event loop thread: `sever()` partitions, `restore()` heals."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.loop = asyncio.new_event_loop()
        self.connected = True
        self.writers: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, name="severable-proxy", daemon=True)
        self.thread.start()
        self.server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]

    def _call(self, coro):  # noqa: ANN001, ANN202
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        if not self.connected:
            return  # black hole: held open, never forwarded, closed on restore
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self.writers.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            asyncio.ensure_future(self._pipe(source, sink))

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                if not self.connected:
                    break
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sink.close()

    async def _close_all(self, connected: bool) -> None:
        self.connected = connected
        for writer in list(self.writers):
            writer.close()
        self.writers.clear()

    def sever(self) -> None:
        self._call(self._close_all(False))

    def restore(self) -> None:
        self._call(self._close_all(True))

    def close(self) -> None:
        self.server.close()
        self._call(self._close_all(False))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@pytest.fixture
def proxy() -> Iterator[SeverableProxy]:
    proxy = SeverableProxy(REDIS)
    yield proxy
    proxy.close()


def _wait_for(predicate, what: str, timeout: float = 30.0):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _ready(url: str) -> dict:
    response = oneshot_http.get(f"{url}/healthz/ready", timeout=5)
    return {"code": response.status_code, **response.json()}


def test_partitioned_engine_refuses_requests_then_returns_under_a_new_generation(engine_factory, proxy) -> None:
    prefix = f"test-partition-{uuid.uuid4().hex[:8]}"
    registry = f"redis://127.0.0.1:{proxy.port}/0?key_prefix={prefix}&ttl_ms=1000"
    reader = RedisLeaseReader.from_url(f"redis://{REDIS[0]}:{REDIS[1]}/0", prefix=prefix)
    engine = engine_factory("partition-engine", extra_args=["--registry", registry])

    def live_generation() -> int | None:
        leases = [lease for lease in reader.list_instances("local") if lease.instance_id == "partition-engine"]
        return leases[0].generation if leases else None

    first = _wait_for(live_generation, "the first registration")
    registry_seen = _ready(engine.url)["lease_registry"]
    assert (registry_seen["mode"], registry_seen["role"], registry_seen["address"]) == (
        "single", "master", f"127.0.0.1:{proxy.port}")
    assert oneshot_http.get(f"{engine.url}/healthz/generation", timeout=5).json()["generation"] == first
    reference = complete(engine.url, BODY).json()["choices"][0]["token_ids"]

    proxy.sever()
    partitioned = _wait_for(lambda: (r := _ready(engine.url))["code"] == 503 and r, "the engine to step down")
    assert {k: partitioned[k] for k in ("code", "status", "engine_status")} == {
        "code": 503, "status": "not_ready", "engine_status": "partitioned"}
    assert partitioned["lease_registry"]["reachable"] is False  # readiness says why, without hanging
    _wait_for(lambda: live_generation() is None, "the registry to let the lease lapse")
    refused = complete(engine.url, BODY)
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "ServiceUnavailableError"
    assert refused.headers["Retry-After"] == "1"
    assert oneshot_http.get(f"{engine.url}/healthz/live", timeout=5).status_code == 200

    proxy.restore()
    _wait_for(lambda: _ready(engine.url)["code"] == 200, "the engine to be ready again")
    second = _wait_for(live_generation, "a new registration")
    assert second > first
    identity = oneshot_http.get(f"{engine.url}/healthz/generation", timeout=5).json()
    assert identity["generation"] == second and identity["boot_generation"] == 1
    again = complete(engine.url, BODY)
    assert again.headers["X-Lifeline-Generation"] == str(second)
    assert again.json()["choices"][0]["token_ids"] == reference
