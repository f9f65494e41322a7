"""`make bench-debezium` (`python -m tests.bench.debezium`): `cdc run` beside Debezium on one stack.

Modules: ``cli`` (arguments, signals, the report), ``bench`` (the phases and the clean-up), ``config`` (the
Debezium variants and the Kafka Connect files they run with), ``connect`` (the Connect standalone JVM),
``table`` (the report), ``jars`` (Maven resolves ``pom.xml`` into .stack/debezium/libs).
The measuring of a drain and the table are shared with `make bench`: ``tests.bench.measure`` and
``tests.bench.table``. ``log4j2.properties`` keeps the worker's log short.
"""
