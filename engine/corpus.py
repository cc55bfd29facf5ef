"""Deterministic training text for the reference tokenizer.

The text is generated, not downloaded, so `lifeline model build` works on a
machine with no network and gives the same tokenizer everywhere. It mixes
English prose about serving systems, code-like lines, numbers and some
multi-byte scripts, so byte-level BPE learns merges that split UTF-8
characters across tokens — which is exactly what the gateway's incremental
detokenizer must handle.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

_NOUNS = (
    "engine gateway region zone cluster replica request stream token prompt model weight "
    "shard checksum lease generation epoch snapshot drill cutover rollback canary alias "
    "version tokenizer template cache block prefix decoder layer attention head vector "
    "queue budget deadline failure recovery operator pager incident runbook service "
    "latency throughput capacity pool node pod socket packet route record server client "
    "session sequence frame event metric trace log policy target window second minute"
).split()
_VERBS = (
    "serves routes drains restarts replicates verifies promotes streams commits resumes "
    "migrates probes renews expires rejects accepts measures schedules retries cancels "
    "loads warms shifts updates reads writes hashes compares reports recovers fails"
).split()
_ADJECTIVES = (
    "healthy ready stale late fresh warm cold primary standby regional global local "
    "exact greedy seeded bounded typed durable partial complete silent noisy quick slow"
).split()
_MULTILINGUAL = (
    "故障 恢复 网关 令牌 区域 模型 权重 流式 请求 续写 "
    "café naïve über señal Ωmega αβγ привет мир こんにちは 서버 🚀 ✅ ⚠️ 🔥"
).split()
_CODE = (
    "def resume(prefix, tokens):",
    "    return prompt + committed_tokens",
    "if lease.expires_at < now: eject(instance_id)",
    '{"request_id": "req-42", "seq": 7, "epoch": 2}',
    "for shard in shards: sha256.update(block)",
    "SELECT version FROM aliases WHERE model = 'tiny';",
    "curl -s http://127.0.0.1:8000/v1/completions -d @body.json",
)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_ADJECTIVES), rng.choice(_NOUNS), rng.choice(_VERBS)]
    words += [rng.choice(("the", "a", "every", "no", "each")), rng.choice(_ADJECTIVES), rng.choice(_NOUNS)]
    if rng.random() < 0.3:
        words += ["in", str(rng.randint(0, 9999)), rng.choice(("ms", "s", "tokens", "GiB"))]
    if rng.random() < 0.15:
        words += rng.sample(_MULTILINGUAL, 2)
    sentence = " ".join(words)
    return sentence[0].upper() + sentence[1:] + rng.choice((".", ".", "!", "?", ";"))


def generate_corpus(lines: int = 20_000, seed: int = 0) -> Iterator[str]:
    """Yield `lines` lines of text, identical for the same arguments."""
    rng = random.Random(seed)
    for _ in range(lines):
        if rng.random() < 0.1:
            yield rng.choice(_CODE)
        else:
            yield " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
