"""outbox CDC: stream a PostgreSQL outbox table from the WAL to Kafka as schema-versioned Avro.

Data flow, one module per stage: ``source`` (replication connection) → ``decode`` (pgoutput) → ``route``
(outbox rows and messages to events and topics) → ``encode`` (Avro) → ``sink`` (Kafka) → ``checkpoint``
(which LSN may be confirmed). ``pipeline`` ties them together; ``config``, ``errors`` and ``cli`` serve all.
"""

__version__ = "0.1.0"
