"""``python -m runtime.cli``: the ``companion`` command."""

import sys

from runtime.cli import main

sys.exit(main())
