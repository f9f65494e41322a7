import sys

from tests.bench.debezium.cli import main

sys.exit(main())
