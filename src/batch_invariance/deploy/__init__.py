"""The deploy gate: reading deploy configs (:mod:`.readers`) and matching their cells to certs
(:mod:`.gate`)."""
