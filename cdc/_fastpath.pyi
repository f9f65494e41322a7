# The compiled extension (rust/src/lib.rs), built by `make install` when cargo is on PATH; cdc.avro.compiled.
from collections.abc import Callable
from typing import Any

class Encoder:
    def __init__(
        self, header: bytes, program: tuple[Any, ...], reference: Callable[[Any], bytes]
    ) -> None: ...
    def __call__(self, payload: Any) -> bytes: ...
    def compiled_only(self, payload: Any) -> bytes | None: ...
