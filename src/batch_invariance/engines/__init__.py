"""Engine adapters: what differs between llama-server and its work-alikes (argv, flags,
readiness, witnesses, cache counters), one :class:`~batch_invariance.engines.base.Engine` each."""
