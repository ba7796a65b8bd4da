"""The ``neuron-workbench`` command line: one module per subcommand in :mod:`.commands`."""
