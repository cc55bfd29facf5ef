"""Defined degradation with Redis away: fail-static leases, frames held in the gateway, typed 503s.

Real Redis processes (the Sentinel lab) are SIGKILLed or SIGSTOPped; the lease
view's window runs on a ManualClock, so nothing here asserts wall-clock time.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

from common.clock import ManualClock
from contract.lease import Lease, NotReplicated, RedisLeaseRegistry, Registration
from gateway.errors import RecoveryImpossible
from gateway.router import LeaseRegistryUnavailable, LeaseView
from gateway.stream_status import StreamEvent, StreamStatus
from gateway.token_log import Frame
from gateway.token_log_buffered import BufferedTokenLog, TokenLogUnavailable
from gateway.token_log_redis import RedisTokenLog
from lifeline.daemons import RedisSentinelLab


def _pause_all(lab: RedisSentinelLab) -> None:
    for node in lab.nodes:
        node.pause()


def _resume_all(lab: RedisSentinelLab) -> None:
    for node in lab.nodes:
        node.resume()


def _log(lab: RedisSentinelLab, *, buffer_frames: int = 100, admit: bool = False, wait: float = 2.0) -> BufferedTokenLog:
    return BufferedTokenLog(RedisTokenLog.from_url(lab.url), buffer_frames=buffer_frames, admit_non_resumable=admit,
                            commit_wait=wait, registry=CollectorRegistry(), flush_interval=0.05)


def _token(seq: int, epoch: int = 0) -> Frame:
    return Frame(seq=seq, kind="token", epoch=epoch, token_ids=(100 + seq,), text=f"t{seq}")


async def _flushed(log: BufferedTokenLog) -> None:
    deadline = time.monotonic() + 30
    while log.held_frames or not log.available:
        assert time.monotonic() < deadline, "held frames were never flushed"
        await asyncio.sleep(0.05)


async def _register_replicated(registry: RedisLeaseRegistry, registration: Registration, within: float = 15.0) -> Lease:
    """Register as an engine does: a refusal for want of a replica's acknowledgement is retried (bounded)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await registry.register(registration)
        except NotReplicated:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)

async def test_lease_view_fails_static_for_its_window_then_refuses_then_recovers(lab: RedisSentinelLab) -> None:
    clock = ManualClock()
    metrics = CollectorRegistry()
    registry = RedisLeaseRegistry.from_url(lab.url, region="local", ttl=timedelta(seconds=2))
    lease = await _register_replicated(registry, Registration("engine-a", "http://127.0.0.1:9001", "tiny-seed0"))
    view = LeaseView(registry, refresh_interval=3600, cached=True, fail_static=10.0, clock=clock, metrics_registry=metrics)
    try:
        await view.start()
        _pause_all(lab)
        assert await view.refresh() is False  # bounded by the socket timeout, not a hang
        assert [x.instance_id for x in await view.current()] == ["engine-a"]  # the last view, kept
        clock.advance(9.9)
        view.check_admission()  # inside the window: still admitting
        assert metrics.get_sample_value("lifeline_gateway_lease_registry_available") == 0
        clock.advance(0.2)
        with pytest.raises(LeaseRegistryUnavailable) as refused:
            view.check_admission()
        assert (refused.value.status_code, refused.value.error_type) == (503, "lease_registry_unavailable")
        assert metrics.get_sample_value("lifeline_gateway_lease_registry_refused_total") == 1
        _resume_all(lab)
        deadline = time.monotonic() + 30
        while not await view.refresh():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        view.check_admission()
        assert [x.generation for x in await view.current()] in ([lease.generation], [])  # may have lapsed meanwhile
    finally:
        _resume_all(lab)
        await view.stop()
        await registry.close()


async def test_streams_in_flight_continue_through_a_primary_kill_and_are_flushed_in_order(lab: RedisSentinelLab) -> None:
    log = _log(lab)
    try:
        await log.create("req-1", {"prompt": [1, 2]}, owner="gw-1")
        for seq in range(5):
            assert await log.append("req-1", 0, _token(seq))
        lab.node(lab.primary_port()).kill()
        for seq in range(5, 10):
            assert await log.append("req-1", 0, _token(seq))  # held in the gateway, in order
        assert await log.advance_epoch("req-1", 0, owner="gw-1", migration=True)  # a migration during the outage
        for seq in range(10, 12):
            assert await log.append("req-1", 1, _token(seq, 1))
        assert await log.apply("req-1", 1, StreamEvent.FINISH)
        assert log.held_frames > 0 and log.available is False
        await _flushed(log)
        frames = await log.frames_after("req-1", -1)
        record = await log.inner.get("req-1")
    finally:
        await log.close()
    assert [f.seq for f in frames] == list(range(12))
    assert [f.token_ids for f in frames] == [(100 + s,) for s in range(12)]
    assert (record.epoch, record.status, record.migrations) == (1, StreamStatus.FINISHED, 1)


async def test_new_streams_are_refused_with_a_typed_503_while_the_log_is_silent(lab: RedisSentinelLab) -> None:
    log = _log(lab)
    try:
        _pause_all(lab)
        with pytest.raises(TokenLogUnavailable) as refused:
            await log.create("req-2", {"prompt": [1]}, owner="gw-1")
        assert (refused.value.status_code, refused.value.error_type) == (503, "token_log_unavailable")
        assert refused.value.headers().get("Retry-After")
        with pytest.raises(TokenLogUnavailable):
            await log.frames_after("req-2", -1)  # resumes need the log too
    finally:
        _resume_all(lab)
        await log.close()


async def test_operator_may_admit_non_resumable_streams_which_reach_the_log_when_it_returns(lab: RedisSentinelLab) -> None:
    log = _log(lab, admit=True)
    try:
        _pause_all(lab)
        await log.create("req-3", {"prompt": [1]}, owner="gw-1")
        for seq in range(3):
            assert await log.append("req-3", 0, _token(seq))
        _resume_all(lab)
        await _flushed(log)
        assert [f.seq for f in await log.frames_after("req-3", -1)] == [0, 1, 2]
    finally:
        _resume_all(lab)
        await log.close()


async def test_a_full_buffer_ends_the_stream_with_a_typed_error_whose_frames_still_commit(lab: RedisSentinelLab) -> None:
    log = _log(lab, buffer_frames=3)
    try:
        await log.create("req-4", {"prompt": [1]}, owner="gw-1")
        _pause_all(lab)
        for seq in range(3):
            assert await log.append("req-4", 0, _token(seq))
        with pytest.raises(RecoveryImpossible) as ended:
            await log.append("req-4", 0, _token(3))
        assert ended.value.error_type == "token_log_unavailable"
        assert await log.append("req-4", 0, Frame(seq=3, kind="token", epoch=0, finish_reason="error"))
        assert await log.append("req-4", 0, Frame(seq=4, kind="error", epoch=0, error={"type": "token_log_unavailable"}))
        assert await log.apply("req-4", 0, StreamEvent.FAIL)
        _resume_all(lab)
        await _flushed(log)
        assert [f.kind for f in await log.frames_after("req-4", -1)] == ["token"] * 4 + ["error"]
        assert (await log.inner.get("req-4")).status is StreamStatus.FAILED
    finally:
        _resume_all(lab)
        await log.close()


async def test_without_a_buffer_a_frame_is_acknowledged_only_once_redis_has_it(lab: RedisSentinelLab) -> None:
    log = _log(lab, buffer_frames=0, wait=30.0)
    try:
        await log.create("req-5", {"prompt": [1]}, owner="gw-1")
        _pause_all(lab)
        commit = asyncio.create_task(log.append("req-5", 0, _token(0)))
        await asyncio.sleep(1.5)
        assert not commit.done()  # not acknowledged: the client has not got it
        _resume_all(lab)
        assert await asyncio.wait_for(commit, 30)
        assert [f.seq for f in await log.inner.frames_after("req-5", -1)] == [0]
        assert log.held_frames == 0

        short = _log(lab, buffer_frames=0, wait=0.3)
        await short.create("req-6", {"prompt": [1]}, owner="gw-1")
        _pause_all(lab)
        with pytest.raises(RecoveryImpossible) as ended:
            await short.append("req-6", 0, _token(0))
        assert ended.value.error_type == "token_log_unavailable"
        _resume_all(lab)
        await short.close()
    finally:
        _resume_all(lab)
        await log.close()


async def test_frames_lost_in_a_failover_are_written_back_by_the_replica_driving_the_stream(lab: RedisSentinelLab) -> None:
    """Asynchronous replication loses the last frames with the primary; the log must not keep a hole."""
    log = _log(lab)
    try:
        await log.create("req-7", {"prompt": [1]}, owner="gw-1")
        for seq in range(3):
            assert await log.append("req-7", 0, _token(seq))
        old, replicas = lab.primary_port(), lab.replicas()
        for replica in replicas:
            replica.pause()
        admin = __import__("redis").Redis(port=old, socket_timeout=1)
        admin.execute_command("CLIENT", "KILL", "TYPE", "replica")
        admin.close()
        for seq in range(3, 6):
            assert await log.append("req-7", 0, _token(seq))  # acknowledged by the old primary only
        lab.node(old).kill()
        for replica in replicas:
            replica.resume()
        lab.wait_for_failover(old)
        deadline = time.monotonic() + 30
        while True:  # the next commit, once the new primary answers
            try:
                ok = await log.append("req-7", 0, _token(6))
                break
            except Exception:  # noqa: BLE001 - still failing over: held, then flushed
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        assert ok
        await _flushed(log)
        frames = await log.inner.frames_after("req-7", -1)
    finally:
        await log.close()
    assert [f.seq for f in frames] == list(range(7))  # no hole where the lost frames were


async def test_streams_that_end_without_telling_the_log_are_forgotten_after_a_while(lab: RedisSentinelLab) -> None:
    log = BufferedTokenLog(RedisTokenLog.from_url(lab.url), buffer_frames=10, admit_non_resumable=False, commit_wait=1.0,
                           registry=CollectorRegistry(), forget_after=0.2)
    try:
        await log.create("req-8", {"prompt": [1]}, owner="gw-1")
        assert await log.append("req-8", 0, _token(0))  # then fenced, say: no finish reaches the log
        await asyncio.sleep(0.3)
        await log.create("req-9", {"prompt": [1]}, owner="gw-1")
        assert set(log._held) == {"req-9"}
    finally:
        await log.close()
