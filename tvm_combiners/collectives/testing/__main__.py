"""``python -m tvm_combiners.collectives.testing``: a command under launch on a simulated cluster."""

import sys

from .cluster import main

sys.exit(main())
