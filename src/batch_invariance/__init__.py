"""batch-invariance: does continuous batching change what an LLM server answers?

One cell (model, ctx, N) is measured with three arms against a real server:
A (``--parallel 1``, serial), B (``--parallel N``, serial) and C (``--parallel N``,
concurrent, repeated). The answer is a JSON cert: GREEN, RED, AMBER or UNVERIFIED.
"""

__version__ = "0.1.0"
