"""Alert-triggered runs: the Alertmanager webhook receiver and its allow-lists (the YAML files beside it)."""
