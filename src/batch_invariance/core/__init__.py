"""The functional core: pure functions and frozen dataclasses. No I/O, no clocks, no process
settings: tests/test_purity.py checks every module here."""
