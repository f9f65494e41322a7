import sys

from tests.bench.debezium.bench import main

sys.exit(main())
