"""The deploy readers: a deploy file (shell script, systemd unit, compose project, Kubernetes
manifest) read on its allowlist into the servers it starts
(:class:`~batch_invariance.gate.server_command.ServerCommand`) and what it does outside
that grammar (:class:`~batch_invariance.gate.server_command.NotUnderstood`). The readers
know nothing of certs or of check-deploy's report: from the gate they import only its value
types and how a serve line is named."""
