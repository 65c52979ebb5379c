"""Action contracts: each action's input and output models, defaults and reference text, free of the clients that implement them."""
