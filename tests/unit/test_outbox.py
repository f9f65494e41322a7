from __future__ import annotations

import uuid

from cdc.outbox import uuid7


def test_uuid7_is_version_7_and_time_ordered():
    ids = [uuid7() for _ in range(200)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == 200
    assert [i.int >> 80 for i in ids] == sorted(i.int >> 80 for i in ids)
