"""`python -m matmul_drift.cli`: the matmul-drift command, as scripts/ and gpu_check.sh run it."""

import sys

from matmul_drift.cli.main import main

sys.exit(main())
