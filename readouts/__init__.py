"""Recipes that expand panels into probes, call the engine and write run directories; and the CLI."""
