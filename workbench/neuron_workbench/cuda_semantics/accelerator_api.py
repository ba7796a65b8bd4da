"""Which ``torch.accelerator`` function does what a ``torch.cuda`` one does (PyTorch 2.6 on).

The scanner suggests these rewrites for a target without a ``torch.<device>`` of its own (tpu); a
run answers a cell's ``torch.accelerator`` calls with its ``torch.cuda``'s, through the same table.
"""

#: ``torch.cuda`` function name to its ``torch.accelerator`` equivalent.
CUDA_TO_ACCELERATOR: dict[str, str] = {
    "is_available": "is_available",
    "device_count": "device_count",
    "synchronize": "synchronize",
    "current_device": "current_device_index",
    "set_device": "set_device_index",
    "device": "device_index",
    "current_stream": "current_stream",
    "set_stream": "set_stream",
    "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "memory_stats": "memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
}
