"""A sampled stream moves only where its tokens can be redrawn, or says that its continuation may differ.

Engines declare on their lease how they sample (contract/sampling.py):
position-keyed engines (the reference engine, vLLM with Lifeline's
sampler) redraw a seeded stream token for token from `prompt ‖ committed`;
an engine with its own sampler (stock vLLM) cannot. A continuation that
cannot be exact is refused `not_resumable` when the client sent a seed,
unless it sent `X-Lifeline-Continuation: may-differ`; otherwise it goes on
and every later chunk carries `continuation: "may_differ"`. Never a silent
different continuation.
"""

from __future__ import annotations

import pytest

from contract.lease import Registration
from contract.sampling import Sampling
from gateway.engine_client import EngineFailure
from gateway.recovery import StreamSession
from gateway.serving import _continuation_header
from gateway.errors import BadRequest
from gateway.settings import RecoveryStrategy
from gateway.stream_request import StreamRequest
from gateway.token_log import Frame
from tests.unit.gateway.scripted import OPEN, Harness, frames_of

KEYED, OWN = Sampling.POSITION_KEYED.value, Sampling.ENGINE_DEFAULT.value


# Failures eject nothing unless a test says so (`ejecting`), so a loop may pin its first attempt to "a" again.
LENIENT = {"consecutive_5xx": 100, "consecutive_local_failures": 100}


async def harness(tiny_model, engines: dict[str, str], *, ejecting: bool = False) -> Harness:
    """`ejecting`: the default outlier detection, under which the lost connection takes "a" out of routing."""
    h = Harness(tiny_model, list(engines), outlier={} if ejecting else LENIENT)
    for instance, sampling in engines.items():
        await h.registry.register(Registration(instance, f"http://{instance}", "v", sampling=sampling))
    return h


async def sampled_session(h: Harness, *, inexact_ok: bool, strategy=RecoveryStrategy.TOKEN_COMMIT_RESUME,
                          temperature: float = 0.8) -> StreamSession:
    h._n += 1
    request = StreamRequest(
        request_id=f"cmpl-s{h._n}", kind="completion", model="m", version="v", prompt_ids=[1, 2, 3], max_tokens=3,
        sampling={"temperature": temperature, "seed": 7}, stop=[], strategy=strategy,
        deadline_wall=h.clock.wall() + 600, created=0, prefer_instance="a", inexact_continuation_ok=inexact_ok)
    await h.log.create(request.request_id, request.to_dict(), owner="gw-1")
    return StreamSession(h.deps, request, h.tokenizer, received_at=h.clock.now())


def tokens(frames: list[Frame]) -> list[int]:
    return [t for f in frames for t in f.token_ids]


def error(frames: list[Frame]) -> dict | None:
    return next((f.error for f in frames if f.kind == "error"), None)


async def test_a_seeded_stream_moves_only_to_an_engine_that_redraws_it(tiny_model):
    h = await harness(tiny_model, {"a": KEYED, "own": OWN, "keyed": KEYED})
    for _ in range(4):  # the pick among candidates is random: every draw must skip the engine's own sampler
        h.engines.scripts.clear()
        h.engines.payloads.clear()
        h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
        h.engines.script("keyed", OPEN, 6, ("finish", 7))
        h.engines.script("own", OPEN, 60, ("finish", 70))
        frames = await frames_of((await sampled_session(h, inexact_ok=False)).run())
        assert error(frames) is None and tokens(frames) == [5, 6, 7]
        assert [p[0] for p in h.engines.payloads] == ["a", "keyed"]
        assert all(f.continuation is None for f in frames)


async def test_a_client_seeded_stream_that_cannot_stay_exact_ends_not_resumable(tiny_model):
    h = await harness(tiny_model, {"a": KEYED, "own": OWN}, ejecting=True)
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    frames = await frames_of((await sampled_session(h, inexact_ok=False)).run())
    refused = error(frames)
    assert refused["type"] == "not_resumable" and "X-Lifeline-Continuation: may-differ" in refused["message"]
    assert tokens(frames) == [5] and [p[0] for p in h.engines.payloads] == ["a"]


async def test_an_inexact_continuation_goes_on_and_says_so_in_every_later_chunk(tiny_model):
    h = await harness(tiny_model, {"a": KEYED, "own": OWN}, ejecting=True)
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("own", OPEN, 6, ("finish", 7))
    frames = await frames_of((await sampled_session(h, inexact_ok=True)).run())
    assert error(frames) is None and tokens(frames) == [5, 6, 7]
    assert [f.continuation for f in frames if f.kind == "token"] == [None, "may_differ", "may_differ"]
    assert h.metrics.inexact_continuations._value.get() == 1


async def test_tokens_an_engines_own_sampler_drew_cannot_be_redrawn_even_by_a_keyed_engine(tiny_model):
    h = await harness(tiny_model, {"a": OWN, "keyed": KEYED})
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    frames = await frames_of((await sampled_session(h, inexact_ok=False)).run())
    assert error(frames)["type"] == "not_resumable"
    assert [f.redrawable for f in frames if f.kind == "token" and f.token_ids] == [False]


async def test_greedy_and_retry_from_scratch_streams_move_anywhere(tiny_model):
    h = await harness(tiny_model, {"a": KEYED, "own": OWN})
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("own", OPEN, 6, ("finish", 7))
    frames = await frames_of((await sampled_session(h, inexact_ok=False, temperature=0.0)).run())
    assert error(frames) is None and all(f.continuation is None for f in frames)
    # retry_from_scratch regenerates under the same seed from the prompt, and checks each regenerated token.
    h.engines.script("a", OPEN, 5, EngineFailure("connection_lost"))
    h.engines.script("own", OPEN, 5, 6, ("finish", 7))
    frames = await frames_of((await sampled_session(h, inexact_ok=False,
                                                    strategy=RecoveryStrategy.RETRY_FROM_SCRATCH)).run())
    assert error(frames) is None and tokens(frames) == [5, 6, 7]


async def test_a_resume_on_another_replica_remembers_what_cannot_be_redrawn(tiny_model):
    h = await harness(tiny_model, {"a": KEYED})
    stored = [Frame(0, "token", 0, (5,), redrawable=False), Frame(1, "token", 1, (6,), continuation="may_differ")]
    rebuilt = [Frame.from_json(f.to_json()) for f in stored]
    assert rebuilt == stored
    session = StreamSession.from_log(h.deps, (await sampled_session(h, inexact_ok=False)).request, h.tokenizer,
                                     epoch=1, frames=rebuilt, migrations=1)
    assert session.redrawable is False and session.continuation == "may_differ"


@pytest.mark.parametrize(("header", "client_seeded", "allowed"), [
    (None, True, False), (None, False, True), ("may-differ", True, True), ("Exact", False, False)])
def test_the_continuation_header_and_its_default(header, client_seeded, allowed):
    assert _continuation_header(header, client_seeded=client_seeded) is allowed


def test_an_unknown_continuation_header_is_a_400_naming_it():
    with pytest.raises(BadRequest) as refused:
        _continuation_header("sometimes", client_seeded=True)
    assert refused.value.param == "X-Lifeline-Continuation"
