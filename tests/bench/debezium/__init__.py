"""`make bench-debezium` (`python -m tests.bench.debezium`): `cdc run` beside Debezium on one stack.

Modules: ``cli`` (arguments, signals, the report), ``bench`` (the phases and the clean-up), ``config`` (the
Debezium variants and the Kafka Connect files they run with), ``connect`` (the Connect standalone JVM),
``measure`` (watermarks, arrival times, CPU, peak RSS, a record decoded), ``table`` (the figures, the
markdown table and the report), ``jars`` (Maven resolves ``pom.xml`` into .stack/debezium/libs).
``log4j2.properties`` keeps the worker's log short.
"""
