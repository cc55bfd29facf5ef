"""Which processes under a stock-vLLM API server are its engine: the one rule the drills and the tests share.

vLLM's OpenAI server (`vllm.entrypoints.openai.api_server`) runs its engine
in child processes that name themselves `VLLM::EngineCore` and, under it,
`VLLM::Worker`; the server also has helpers (multiprocessing's resource
tracker) that are not the engine. Stopping the engine processes alone
leaves the API server answering `/health` 200 while nothing is computed:
the wedge vLLM's own health check does not see.
"""

from __future__ import annotations

import psutil

ENGINE_TITLE = "VLLM::"  # the process title vLLM's engine processes set


def engine_processes(server_pid: int) -> list[psutil.Process]:
    """The engine core and its workers under the API server `server_pid`, outermost first; [] when it is gone."""
    try:
        descendants = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    engine = []
    for process in descendants:
        try:
            title = (process.cmdline() or [""])[0]
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        if title.startswith(ENGINE_TITLE):
            engine.append(process)
    return engine
