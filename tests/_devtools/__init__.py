# A package, so that this test_layers.py and tests/trace/test_layers.py get distinct module names.
