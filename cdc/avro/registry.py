"""Confluent framing: schemas in a Confluent-compatible Schema Registry, values as ``00`` + schema id + body.

The value of a record is the magic byte ``0``, the schema id as 4 bytes big-endian, and the Avro binary body;
consumers fetch the writer's schema by id. Schemas are registered under a subject chosen by
``subject_name_strategy``:

- ``topic_record`` (default, Confluent's TopicRecordNameStrategy): ``<topic>-<record full name>``. One
  topic carries every event type of an aggregate, each with a history of its own.
- ``topic`` (TopicNameStrategy): ``<topic>-value``; only sensible with one event type per topic.
- ``record`` (RecordNameStrategy): ``<record full name>``, shared by every topic.

The first time a subject is used, its compatibility level is set to ``schema_compatibility`` and versions
1..N of the event type are looked up and registered in order, so that the registry checks the same history
``cdc schemas check`` does. Ids are cached for the life of the process: once a route is known the hot path
never calls the registry.

Failures are sorted at this boundary. The registry refusing a schema (HTTP 409, incompatible with the
subject; 422, invalid) is the event's problem: :class:`SchemaRejectedError`, and the event goes to the
dead-letter topic. Everything else (refused connection, timeout, 5xx, 401/403) is infrastructure:
:class:`RegistryUnavailableError`, and the caller waits with backoff. An infrastructure failure never sends
an event to the dead-letter topic.
"""

from __future__ import annotations

import os
import time
from typing import Any, Final
from urllib.parse import unquote, urlsplit, urlunsplit

import orjson
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from fastavro.schema import parse_schema

from cdc.avro.store import SchemaStore, StoredSchema
from cdc.config import Settings, redact_dsn
from cdc.errors import (
    AccessDeniedError,
    ConfigError,
    DeserializationError,
    RegistryUnavailableError,
    SchemaRejectedError,
    first_line,
)

__all__ = ["SchemaRegistry"]

REQUEST_TIMEOUT: Final = 10.0  # seconds; one attempt, retries are the caller's backoff
REJECTION_TTL: Final = 30.0  # seconds a refusal is remembered: a burst of its events must not each ask again
_NOT_FOUND: Final = (40401, 40403)  # subject not found, schema not found


class SchemaRegistry:
    """Registration and lookup of ``schemas/`` in a Confluent-compatible registry (module docstring)."""

    def __init__(
        self,
        url: str,
        store: SchemaStore,
        *,
        compatibility: str = "BACKWARD",
        strategy: str = "topic_record",
        timeout: float = REQUEST_TIMEOUT,
        ca_file: str | None = None,
    ) -> None:
        self.store = store
        self.compatibility = compatibility
        self.strategy = strategy
        self.shown_url = redact_dsn(url)
        parts = urlsplit(url)
        conf: dict[str, Any] = {"max.retries": 0, "timeout": timeout}
        if parts.username is not None:
            # Credentials go to the client apart from the URL, so that no error text can carry them.
            conf["basic.auth.user.info"] = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
        conf["url"] = urlunsplit(parts)
        if ca_file is not None:
            if not os.access(ca_file, os.R_OK):
                raise ConfigError(
                    f"setting 'schema_registry_ca_file' names {ca_file}, which this process cannot read: "
                    "give the PEM file of the CA that signed the registry's certificate",
                    key="schema_registry_ca_file",
                )
            conf["ssl.ca.location"] = ca_file
        try:
            self.client = SchemaRegistryClient(conf)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"schema_registry_url {self.shown_url} is not usable: {exc}") from exc
        self._ids: dict[tuple[str, str, int], int] = {}  # (subject, event type, version) -> schema id
        self._configured: set[str] = set()
        self._writers: dict[int, Any] = {}
        self._rejected: dict[tuple[str, str, int], tuple[float, SchemaRejectedError]] = {}

    @classmethod
    def from_settings(cls, settings: Settings, store: SchemaStore) -> SchemaRegistry:
        if settings.schema_registry_url is None:
            raise ConfigError(
                "setting 'schema_registry_url' is required for the confluent framing: set "
                "CDC_SCHEMA_REGISTRY_URL or schema_registry_url in the config file",
                key="schema_registry_url",
            )
        return cls(
            settings.schema_registry_url,
            store,
            compatibility=settings.schema_compatibility,
            strategy=settings.subject_name_strategy,
            ca_file=settings.schema_registry_ca_file,
        )

    def close(self) -> None:
        """Close the HTTP session (safe to call twice)."""
        self.client.close()

    def __enter__(self) -> SchemaRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subject(self, topic: str, stored: StoredSchema) -> str:
        record: str = stored.parsed["name"]  # fastavro's parsed form carries the full name
        if self.strategy == "topic":
            return f"{topic}-value"
        if self.strategy == "record":
            return record
        return f"{topic}-{record}"

    def schema_id(self, topic: str, event_type: str, version: int) -> int:
        """The id of ``event_type`` v``version`` under the topic's subject, registering what is missing.

        SchemaNotFoundError (no such file), SchemaRejectedError (the registry refuses it) or
        RegistryUnavailableError (try again later).
        """
        stored = self.store.get(event_type, version)
        subject = self.subject(topic, stored)
        if (hit := self._ids.get((subject, event_type, version))) is not None:
            return hit
        for earlier in range(1, version + 1):
            self._register(subject, self.store.get(event_type, earlier))
        return self._ids[(subject, event_type, version)]

    def register_all(self, topic: str, event_type: str) -> list[tuple[int, str, int]]:
        """Register every version of ``event_type`` in order: ``[(version, subject, id), ...]``."""
        versions = [v for et, v in self.store.available() if et == event_type]
        out = []
        for version in versions:
            stored = self.store.get(event_type, version)
            subject = self.subject(topic, stored)
            out.append((version, subject, self._register(subject, stored)))
        return out

    def writer_schema(self, schema_id: int) -> Any:
        """The parsed writer schema of ``schema_id`` (cached), for consumers."""
        if (hit := self._writers.get(schema_id)) is not None:
            return hit
        try:
            found = self.client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise DeserializationError(
                    f"schema id {schema_id} is not in the schema registry {self.shown_url}"
                ) from exc
            raise self.unavailable(f"fetching schema id {schema_id}", exc) from exc
        except Exception as exc:
            raise self.unavailable(f"fetching schema id {schema_id}", exc) from exc
        # What the registry holds is the record's problem, not the registry's: another producer may have
        # framed its value with a JSON or Protobuf schema, or stored text that is not Avro.
        what = f"schema id {schema_id} in the schema registry {self.shown_url}"
        if (found.schema_type or "AVRO").upper() != "AVRO":
            raise DeserializationError(
                f"{what}: a {str(found.schema_type).upper()[:16]} schema, not Avro: the value was not "
                "written by outbox CDC"
            )
        try:
            parsed = parse_schema(orjson.loads(found.schema_str or ""))
        except Exception as exc:  # orjson.JSONDecodeError, fastavro's SchemaParseException, KeyError, ...
            why = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            raise DeserializationError(f"{what}: not valid Avro ({why})") from exc
        self._writers[schema_id] = parsed
        return parsed

    def check_access(self) -> None:
        """Refuse (:class:`AccessDeniedError`) when the registry refuses who we are: a certificate the CA
        file does not vouch for, a host name it does not hold, credentials it does not take. One request;
        a registry that does not answer is not refused here: events wait for it, as ever."""
        try:
            self.client.get_subjects()
        except SchemaRegistryError as exc:
            if exc.http_status_code in (401, 403):
                raise AccessDeniedError(
                    f"the schema registry {self.shown_url} refused the credentials (HTTP "
                    f"{exc.http_status_code}): give user:password in schema_registry_url",
                    key="schema_registry_url",
                ) from exc
        except Exception as exc:
            text = str(exc)
            if "certificate" not in text.lower():
                return
            if "hostname" in text.lower():
                raise AccessDeniedError(
                    f"the schema registry's certificate does not name the host of schema_registry_url "
                    f"{self.shown_url} ({first_line(exc)}): connect by a name it holds",
                    key="schema_registry_url",
                ) from exc
            raise AccessDeniedError(
                f"the schema registry's certificate at {self.shown_url} is not signed by a CA this process "
                f"trusts ({first_line(exc)}): set schema_registry_ca_file to the CA that signed it",
                key="schema_registry_ca_file",
            ) from exc

    # -- internals -------------------------------------------------------------------------------------

    def _register(self, subject: str, stored: StoredSchema) -> int:
        key = (subject, stored.event_type, stored.version)
        if (hit := self._ids.get(key)) is not None:
            return hit
        if (refused := self._rejected.get(key)) is not None and refused[0] > time.monotonic():
            raise SchemaRejectedError(refused[1].message) from refused[1]
        try:
            schema_id = self._lookup_or_register(subject, stored)
        except SchemaRejectedError as exc:
            self._rejected[key] = (time.monotonic() + REJECTION_TTL, exc)
            raise
        self._rejected.pop(key, None)
        self._ids[key] = schema_id
        return schema_id

    def _lookup_or_register(self, subject: str, stored: StoredSchema) -> int:
        what = f"{stored.event_type} v{stored.version} under subject {subject!r}"
        schema = Schema(stored.text, "AVRO")
        try:
            if subject not in self._configured:
                self.client.set_compatibility(subject, self.compatibility)
                self._configured.add(subject)
            try:
                schema_id = self.client.lookup_schema(subject, schema).schema_id
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404 or exc.error_code not in (*_NOT_FOUND, -1):
                    raise
                schema_id = self.client.register_schema(subject, schema)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 409:
                raise SchemaRejectedError(
                    f"the schema registry refuses {what}: it is not {self.compatibility} compatible with "
                    f"the versions registered there ({exc.error_message}); run `cdc schemas check`"
                ) from exc
            if exc.http_status_code == 422:
                raise SchemaRejectedError(
                    f"the schema registry refuses {what} as invalid: {exc.error_message}"
                ) from exc
            raise self.unavailable(f"registering {what}", exc) from exc
        except Exception as exc:
            raise self.unavailable(f"registering {what}", exc) from exc
        if schema_id is None:
            raise RegistryUnavailableError(f"the schema registry {self.shown_url} returned no id for {what}")
        return schema_id

    def unavailable(self, doing: str, exc: Exception) -> RegistryUnavailableError:
        """A failed call, as infrastructure: what it was doing and the registry's answer (no credentials)."""
        if isinstance(exc, SchemaRegistryError):
            why = f"HTTP {exc.http_status_code}: {exc.error_message}"
        else:
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return RegistryUnavailableError(f"schema registry {self.shown_url} failed {doing}: {why}")
