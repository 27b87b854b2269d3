"""The GitHub Action: its inputs and outputs, its entrypoint, and the container's preflight and
file ownership. ``python -m batch_invariance.action`` runs the entrypoint."""
