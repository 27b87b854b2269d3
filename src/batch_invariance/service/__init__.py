"""Services the commands and the Action call: a live, mock or sweep cell from a request to a
written cert (request, job, target, profile, provenance, dry run, work-set, scorer)."""
