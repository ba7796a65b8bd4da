"""The package's version, in one place: a leaf every layer may read (reports, artifacts, the CLI).

The root module re-exports it as ``neuron_workbench.__version__``; hatch reads it from here.
"""

__version__ = "0.1.0"
