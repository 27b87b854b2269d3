"""The deploy gate: the servers the readers found, as the cells they run, held against the
certs that measured them (check-deploy), and what ``serve`` runs from a cert (its argv, its
environment and its pinned files). It reads deploy files only through
:mod:`batch_invariance.deploy.readers`."""
