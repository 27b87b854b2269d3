"""Server processes the tool runs or attaches to: supervision, launchers, attach mode, ports."""
