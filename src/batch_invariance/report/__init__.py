"""The batch-invariance report: many certs in one view (HTML, Markdown job summary, JSON).

:mod:`.model` (pure) turns checked certs into typed rows; :mod:`.plot`, :mod:`.html`,
:mod:`.markdown` and :mod:`.summary` (pure) render them; :mod:`.load` (the shell) finds,
reads and verifies the cert files and their sigstore bundles.
"""
