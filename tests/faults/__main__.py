import sys

from tests.faults.run import main

sys.exit(main())
