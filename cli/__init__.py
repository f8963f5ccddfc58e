"""The `readout` command line, the top layer: `main` assembles the commands, `options` declares the options several
commands share (each once) and the groups a command takes them in, and each other module holds one group of
commands. Nothing else in the project imports this package, and no other package imports click."""
