"""Provisioning: the embedded default (llama-server + Gemma 3 270M) and engines in pinned venvs."""
