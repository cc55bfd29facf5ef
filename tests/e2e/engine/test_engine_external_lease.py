"""An engine that holds no lease of its own is served under every generation its lease holder registers.

The regional agent (or anyone) holds the lease of an engine started without
`--registry`; each registration gets a new generation from the registry. The
engine cannot know it, so it leaves `X-Lifeline-Generation` out and the
gateway's generation fence, which checks only a header that is present,
lets its frames through. Before, the engine stamped its boot generation (1),
and the gateway refused every frame under a second registration
(`stale_generation`). Here the test is the lease holder, through the
gateway's own lease endpoint.
"""

from __future__ import annotations

import threading

from common import oneshot_http
from lifeline.processes import LEASE_TOKEN, GatewayProcess, free_port, gateway_config
from tests.support.sse import stream_completion

AUTH = {"Authorization": f"Bearer {LEASE_TOKEN}"}
BODY = {"model": "tiny", "prompt": "The agent holds this lease", "max_tokens": 12, "temperature": 0.0,
        "ignore_eos": True, "return_token_ids": True}


class ExternalHolder:
    """Registers, renews (a thread, every 0.4 s of a 2 s TTL) and releases one engine's lease on the gateway."""

    def __init__(self, gateway_url: str, registration: dict[str, str]) -> None:
        self.gateway_url = gateway_url
        self.registration = registration
        self.generation: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._renewer = threading.Thread(target=self._renew_until_stopped, daemon=True)
        self._renewer.start()

    def register(self) -> int:
        response = oneshot_http.post(f"{self.gateway_url}/lifeline/v1/leases", json=self.registration, headers=AUTH, timeout=5)
        response.raise_for_status()
        with self._lock:
            self.generation = int(response.json()["generation"])
            return self.generation

    def release(self) -> None:
        with self._lock:
            generation, self.generation = self.generation, None
        oneshot_http.delete(f"{self.gateway_url}/lifeline/v1/leases/{self.registration['instance_id']}",
                            params={"generation": generation}, headers=AUTH, timeout=5).raise_for_status()

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(0.4):
            with self._lock:
                generation = self.generation
                if generation is not None:
                    oneshot_http.put(f"{self.gateway_url}/lifeline/v1/leases/{self.registration['instance_id']}",
                                     json={"generation": generation}, headers=AUTH, timeout=5)

    def close(self) -> None:
        self._stop.set()
        self._renewer.join(timeout=10)


def test_leaseless_engine_is_served_under_every_generation_its_holder_registers(engine_factory, tiny_model,
                                                                                  tmp_path) -> None:
    engine = engine_factory("leased-by-agent", extra_args=["--region", "local"])
    expected = oneshot_http.post(f"{engine.url}/v1/completions", json={**BODY, "model": tiny_model.name},
                                 timeout=60).json()["choices"][0]["token_ids"]
    assert oneshot_http.get(f"{engine.url}/healthz/generation").json()["generation"] == 1  # its boot counter
    gateway = GatewayProcess(gateway_config(tiny_model, registry={"state_dir": str(tmp_path / "gw-state")}),
                             free_port(), tmp_path / "gw")
    gateway.start()
    holder = ExternalHolder(gateway.url, {"instance_id": "leased-by-agent", "url": engine.url,
                                          "version": tiny_model.name, "zone": "local-a", "region": "local"})
    try:
        gateway.wait_live()
        generations = []
        for _ in range(3):  # register, then release and register again, twice
            if generations:
                holder.release()
            generations.append(holder.register())
            gateway.wait_routable("tiny", 1)
            assert gateway.leases() == {"leased-by-agent": generations[-1]}
            for _ in range(2):
                result = stream_completion(gateway.url, BODY)
                assert result.error is None, result.error
                assert result.token_ids == expected and result.finish_reason == "length"
        assert generations == [generations[0], generations[0] + 1, generations[0] + 2]
        assert gateway.metric("lifeline_gateway_migrations_total") == 0  # no stale_generation, nothing else either
        assert gateway.metric("lifeline_gateway_stale_frames_dropped_total") == 0
    finally:
        holder.close()
        gateway.kill()
