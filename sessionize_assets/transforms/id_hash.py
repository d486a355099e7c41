"""Spark's `xxhash64` of a text, computed on the driver: the id index's `id_hash`.

The id index (`event_ids`) stores `xxhash64(event_id)` as Spark computes it: XXH64 (the
xxHash 64-bit algorithm) of the text's UTF-8 bytes with Spark's seed, 42, read as a signed
long. That value is persisted, so it is a file format, not an implementation detail. A check
of a small run looks a few hundred ids up in the index: with their hashes computed here, the
lookup is a hash set in the query, one Spark job, instead of a join with a frame of the ids
(a broadcast job of its own). The tests compare it with Spark's on arbitrary texts.
"""

_MASK = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5
# Spark's seed for `xxhash64` (org.apache.spark.sql.catalyst.expressions.XxHash64).
SPARK_SEED = 42


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _MASK, 31) * _P1) & _MASK


def _merge(acc: int, value: int) -> int:
    return ((acc ^ _round(0, value)) * _P1 + _P4) & _MASK


def _lane(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "little")


def xxhash64(text: str, *, seed: int = SPARK_SEED) -> int:
    """`xxhash64(text)` as Spark computes it (a signed 64-bit integer)."""
    data = text.encode("utf-8")
    size, at = len(data), 0
    if size >= 32:
        lanes = [seed + _P1 + _P2, seed + _P2, seed, seed - _P1]
        lanes = [lane & _MASK for lane in lanes]
        while at + 32 <= size:
            lanes = [_round(lane, _lane(data, at + 8 * i, 8)) for i, lane in enumerate(lanes)]
            at += 32
        acc = _rotl(lanes[0], 1) + _rotl(lanes[1], 7) + _rotl(lanes[2], 12) + _rotl(lanes[3], 18)
        acc &= _MASK
        for lane in lanes:
            acc = _merge(acc, lane)
    else:
        acc = (seed + _P5) & _MASK
    acc = (acc + size) & _MASK
    while at + 8 <= size:
        acc = (_rotl(acc ^ _round(0, _lane(data, at, 8)), 27) * _P1 + _P4) & _MASK
        at += 8
    if at + 4 <= size:
        acc = (_rotl(acc ^ ((_lane(data, at, 4) * _P1) & _MASK), 23) * _P2 + _P3) & _MASK
        at += 4
    while at < size:
        acc = (_rotl(acc ^ ((data[at] * _P5) & _MASK), 11) * _P1) & _MASK
        at += 1
    acc = ((acc ^ (acc >> 33)) * _P2) & _MASK
    acc = ((acc ^ (acc >> 29)) * _P3) & _MASK
    acc ^= acc >> 32
    return acc - (1 << 64) if acc >= 1 << 63 else acc
