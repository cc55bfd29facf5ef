"""The ledger's framing: what a crash can leave behind replays to a consistent prefix."""

from __future__ import annotations

import pytest

from holder.ledger import Ledger, LedgerLocked, encode_record, read_records

RECORDS = [{"op": "boot", "epoch": 1},
           {"op": "reserve", "region": 1, "path": "/dev/shm/x/region-000001.bin", "size": 128, "purpose": "weights",
            "owner": "holder", "tensors": [], "meta": {}},
           {"op": "seal", "region": 1, "checksum": "sha256:00", "epoch": 1}]


def write_ledger(path, records):
    ledger = Ledger.open(path)
    for record in records:
        ledger.append(record)
    ledger.close()


def test_records_survive_a_reopen_in_order(tmp_path):
    path = tmp_path / "ledger.wal"
    write_ledger(path, RECORDS)
    reopened = Ledger.open(path)
    assert reopened.records == RECORDS
    assert reopened.torn_bytes == 0
    reopened.close()


def test_every_torn_tail_replays_to_the_records_before_it(tmp_path):
    """A holder killed at any byte of its last write: that record is gone, the rest intact."""
    whole = b"".join(encode_record(r) for r in RECORDS)
    last = len(encode_record(RECORDS[-1]))
    for cut in range(1, last):
        records, consistent = read_records(whole[:-cut])
        assert records == RECORDS[:-1], cut
        assert consistent == len(whole) - last


def test_a_torn_tail_is_truncated_so_new_records_follow_the_prefix(tmp_path):
    path = tmp_path / "ledger.wal"
    write_ledger(path, RECORDS)
    data = path.read_bytes()
    path.write_bytes(data[:-5])  # killed mid-write of the seal
    ledger = Ledger.open(path)
    assert ledger.records == RECORDS[:-1]
    assert ledger.torn_bytes == len(encode_record(RECORDS[-1])) - 5
    ledger.append({"op": "free", "region": 1, "reason": "unsealed"})
    ledger.close()
    assert Ledger.open(path).records == [*RECORDS[:-1], {"op": "free", "region": 1, "reason": "unsealed"}]


def test_a_corrupt_record_ends_the_replay_there(tmp_path):
    whole = bytearray(b"".join(encode_record(r) for r in RECORDS))
    second = len(encode_record(RECORDS[0]))
    whole[second + 12] ^= 0x01  # one bit in the reserve record's payload
    records, consistent = read_records(bytes(whole))
    assert records == RECORDS[:1]
    assert consistent == second


@pytest.mark.parametrize("tail", [b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x05\x00\x00\x00", b"\x00" * 64],
                         ids=["huge-length", "short-header", "zeros"])
def test_garbage_after_the_last_record_is_not_a_record(tail):
    whole = b"".join(encode_record(r) for r in RECORDS)
    records, consistent = read_records(whole + tail)
    assert records == RECORDS
    assert consistent == len(whole)


def test_one_writer_per_ledger(tmp_path):
    first = Ledger.open(tmp_path / "ledger.wal")
    with pytest.raises(LedgerLocked):
        Ledger.open(tmp_path / "ledger.wal")
    first.close()
    Ledger.open(tmp_path / "ledger.wal").close()
