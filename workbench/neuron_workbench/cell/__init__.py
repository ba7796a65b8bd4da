"""One cell, end to end: its options, the pipeline that runs and compares it, the session.

Every front end (``%%neuron``, ``neuron-workbench run``/``record``/``compare``) parses its arguments
into the options of :mod:`neuron_workbench.cell.options` and hands them to a
:class:`~neuron_workbench.cell.session.Session`, which runs the cell on its backends
(:mod:`neuron_workbench.cell.pipeline`) and returns finished reports.
"""
