"""The deploy readers: a deploy file (shell script, systemd unit, compose project, Kubernetes
manifest, models.toml) read on its allowlist into the servers it starts
(:class:`~batch_invariance.deploy.readers.commands.ServerCommand`) and what it does outside
that grammar (:class:`~batch_invariance.deploy.readers.commands.NotUnderstood`). The readers
know nothing of certs: the gate imports them, never the reverse."""
