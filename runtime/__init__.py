"""What the worker and the CLI share at run time: the Temporal connection and converter, logging, the worker."""
