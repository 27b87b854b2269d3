"""Servers under test: the llama-server process, the loopback mock, host facts, provisioning."""
