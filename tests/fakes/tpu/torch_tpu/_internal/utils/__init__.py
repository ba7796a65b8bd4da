"""FAKE ``torch_tpu._internal.utils``."""

from torch_tpu._internal.utils import utils

__all__ = ["utils"]
