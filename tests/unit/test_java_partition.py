"""The tests' reference of Kafka's Java partitioner (tests.plugins.kafka.murmur2), checked against the values
of Kafka's own UtilsTest.testMurmur2, so that the replay tests' partition assertions mean what they say."""

from __future__ import annotations

import pytest

from tests.plugins.kafka import java_partition, murmur2

KAFKA_UTILS_TEST = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize(("text", "expected"), KAFKA_UTILS_TEST.items())
def test_murmur2_gives_kafkas_values(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected & 0xFFFFFFFF


def test_a_partition_is_the_positive_hash_modulo_the_count() -> None:
    assert java_partition(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert {java_partition(f"k{i}".encode(), 3) for i in range(100)} == {0, 1, 2}
