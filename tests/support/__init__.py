"""Helpers shared by the tests: cert and evidence factories, fake servers and engines, report
inputs, and the repository paths. Imported as ``tests.support.<module>``."""
