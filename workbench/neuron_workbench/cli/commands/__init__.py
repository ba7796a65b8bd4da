"""Subcommands of ``neuron-workbench``.

Each module here defines ``NAME`` (the subcommand), ``HELP`` (one line), ``configure(parser)`` and
``run(args) -> int`` (the exit code). :mod:`neuron_workbench.cli.main` discovers them, so adding a
subcommand means adding a module and nothing else.
"""
