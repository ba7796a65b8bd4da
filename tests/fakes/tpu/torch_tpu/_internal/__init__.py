"""FAKE ``torch_tpu._internal``."""

from torch_tpu._internal import execution_mode, utils

__all__ = ["execution_mode", "utils"]
