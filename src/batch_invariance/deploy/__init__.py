"""check-deploy: the deploy files read on their allowlist (:mod:`.readers`), and check-deploy's
own report, plan and cert store, built on the gate's rules (:mod:`batch_invariance.gate`)."""
