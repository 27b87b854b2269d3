"""``python -m batch_invariance`` runs the CLI."""

from batch_invariance.cli import main

raise SystemExit(main())
