"""``serve``'s proof at start, on the serving host, beyond the gate's rules
(:mod:`batch_invariance.gate`): the files it runs pinned by descriptor (:mod:`.pinned_files`),
the cert in a folder that measured an engine command (:mod:`.command_cert`), the argv and
environment it execs (:mod:`.exec_argv`) and the CPU rule only the serving host can check
(:mod:`.cpu_variant`). ``commands/serve.py`` is its shell."""
