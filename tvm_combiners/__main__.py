"""``python -m tvm_combiners``: the ``tvm-combiners`` command."""

import sys

from .app.cli import main

if __name__ == "__main__":
    sys.exit(main())
