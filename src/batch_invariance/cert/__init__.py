"""The cert: its JSON model, building, verification, storage and signing."""
