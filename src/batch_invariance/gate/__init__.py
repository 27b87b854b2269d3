"""The gate's rules, one set for ``serve`` (at start, on the serving host) and for check-deploy
(ahead of time, from the deploy files): the server a command line starts as the cell it runs
(:mod:`.cells`), reading a ``batch-invariance serve`` line as the server it execs
(:mod:`.serve_line`, :mod:`.served`), and which cert covers a cell (:mod:`.check`,
:mod:`.coverage`). The readers of deploy files hand the gate :mod:`.server_command` values;
the gate imports neither :mod:`batch_invariance.deploy` nor :mod:`batch_invariance.serve`."""
