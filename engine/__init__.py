"""Models in, numbers out: load checkpoints, render prompts, score next-token letter mass."""
