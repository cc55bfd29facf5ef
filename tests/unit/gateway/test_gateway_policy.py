"""Pure pieces of recovery: the migrate-or-fail decision, text assembly, the retry budget, settings."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from gateway.admission import RetryBudget
from gateway.policy import decide
from common.detokenize import TextAssembler
from gateway.settings import GatewaySettings, RecoveryStrategy
from lifeline.processes import built_model

OK = {"strategy": RecoveryStrategy.TOKEN_COMMIT_RESUME, "migrations": 0, "max_migrations": 3,
      "deadline_remaining": 10.0, "min_deadline_remaining": 0.5}


@pytest.mark.parametrize(("change", "reason"), [
    ({}, ""),
    ({"strategy": RecoveryStrategy.FAIL_STOP}, "engine_failed"),
    ({"migrations": 3}, "migration_limit"),
    ({"deadline_remaining": 0.2}, "deadline_exceeded"),
    ({"strategy": RecoveryStrategy.RETRY_FROM_SCRATCH}, ""),
    ({"stateful": True}, ""),  # no token committed yet: the grammar starts afresh elsewhere
    ({"stateful": True, "committed": 1}, "not_resumable"),
    ({"stateful": True, "committed": 1, "strategy": RecoveryStrategy.RETRY_FROM_SCRATCH}, ""),
])
def test_decide_migrates_only_within_bounds(change, reason):
    decision = decide(**{**OK, **change})
    assert decision.migrate is (reason == "")
    assert decision.reason == reason


def test_retry_budget_caps_migrations_in_flight():
    budget = RetryBudget(ratio=0.2, minimum=1, active_requests=20)
    assert [budget.try_acquire() for _ in range(5)] == [True, True, True, True, False]
    budget.release()
    assert budget.try_acquire()
    assert RetryBudget(ratio=0.2, minimum=0, active_requests=2).try_acquire() is False


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(built_model("tiny", 0) / "tokenizer.json"))


def test_text_assembler_never_emits_half_a_character(tokenizer):
    text = "région → 東京 ✓"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    asm = TextAssembler(tokenizer, [])
    deltas = [asm.push(t, final=i == len(ids) - 1)[0] for i, t in enumerate(ids)]
    assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)


def test_text_assembler_applies_stop_strings_across_tokens(tokenizer):
    ids = tokenizer.encode("alpha beta gamma delta", add_special_tokens=False).ids
    asm = TextAssembler(tokenizer, [" gam"])
    out, stopped = "", False
    for t in ids:
        delta, stopped = asm.push(t, final=False)
        out += delta
        if stopped:
            break
    assert stopped and out == "alpha beta"


def test_settings_reject_long_ttl_and_name_the_key(tmp_path):
    with pytest.raises(ValidationError, match="registry.ttl"):
        GatewaySettings.load(None, models=[{"alias": "m", "version": "v", "model_dir": str(tmp_path)}], registry={"ttl": 5})
    with pytest.raises(ValidationError, match="version 'w' is not a version"):
        GatewaySettings.load(None, models=[{"alias": "m", "version": "v", "model_dir": str(tmp_path)}],
                             engines=[{"instance_id": "e", "url": "http://x", "version": "w"}])
    with pytest.raises(ValidationError, match="token_log.url is required"):
        GatewaySettings.load(None, models=[{"alias": "m", "version": "v", "model_dir": str(tmp_path)}], token_log={"kind": "redis"})


def test_environment_overrides_the_file(tmp_path, monkeypatch):
    path = tmp_path / "gw.yaml"
    path.write_text(f"models: [{{alias: m, version: v, model_dir: {tmp_path}}}]\nrecovery: {{max_migrations: 5}}\n")
    monkeypatch.setenv("LIFELINE_GATEWAY_RECOVERY__STALL_TIMEOUT", "0.75")
    settings = GatewaySettings.load(path)
    assert settings.recovery.stall_timeout == timedelta(seconds=0.75)
    assert settings.recovery.max_migrations == 5
    assert settings.recovery.strategy is RecoveryStrategy.TOKEN_COMMIT_RESUME


def test_a_draining_silence_that_is_not_positive_stops_start_up_naming_the_key(tmp_path):
    models = [{"alias": "m", "version": "v", "model_dir": str(tmp_path)}]
    with pytest.raises(ValidationError, match="recovery.draining_silence must be positive"):
        GatewaySettings.load(None, models=models, recovery={"draining_silence": 0})
    assert GatewaySettings.load(None, models=models).recovery.draining_silence == timedelta(milliseconds=300)
