"""Recovery actions: one module per system, each function registered in the action registry."""
