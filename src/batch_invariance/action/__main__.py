"""``python -m batch_invariance.action``: the Action's entrypoint."""

import sys

from batch_invariance.action.entrypoint import main

raise SystemExit(main(sys.argv[1:]))
