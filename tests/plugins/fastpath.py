"""The compiled extension cdc._fastpath, for the tests that hold it to the Python code.

`make install` builds it wherever cargo 1.77 or later is on PATH, as on the CI machine. Without it a
developer's run skips those tests with the reason; under CI=true that is a failure, as for a missing service.
"""

from __future__ import annotations

import os

import pytest

from cdc import fastpath


@pytest.fixture
def compiled_extension() -> None:
    if not fastpath.available():
        message = "cdc._fastpath is not built (cargo 1.77+ on PATH, then `make install`)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}: under CI=true the compiled hot path must be tested", pytrace=False)
        pytest.skip(message)
