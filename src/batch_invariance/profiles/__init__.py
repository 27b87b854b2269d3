"""Measurement profiles: everything model- and task-specific for one kind of workload.

A profile is a folder. Bundled ones live here (``batch_invariance/profiles/<name>/``);
``--profile`` also accepts the path of a user's own folder with the same layout::

    <profile>/
      profile.toml          [profile] name, description
                            [workset] corners = [...], default_corner, default_seed
      workset.py            generate(ctx, corner, seed, token_counter) -> list[WorkItem]
      scorer.py             make_scorer() -> batch_invariance.core.scoring.Scorer
      models.example.toml   the model registry template (see profiles.models)
      models.toml           optional: the user's copy (also looked for in the current folder)

``generate`` must be deterministic and take the number of tokens of a text from
``token_counter`` (``profiles.tokens``); it may raise :class:`UsageError` for bad arguments.
The two modules are imported as a package, so they may import siblings with relative imports.
Anything that goes wrong while loading or running them is a one-line :class:`UsageError`
naming the file; an :class:`InfraError` (a failed ``/tokenize``) passes through as it is.

``loader`` loads a profile folder, ``registry`` finds its ``models.toml`` and resolves an
alias (read by ``models``), ``overrides`` merges the command line over both into the one
:class:`~batch_invariance.profiles.overrides.ProfileRun`.
"""
