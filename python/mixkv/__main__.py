"""`python -m mixkv ARGS`: the mixkv command line, run in process by the extension."""

import sys

from . import main

sys.exit(main())
