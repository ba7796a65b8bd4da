"""Streams of a device that runs synchronously: the host standing in for CUDA, the emulated devices.

Work there is done when the call returns, so a stream has nothing to wait for and nothing to order;
prefetching loaders (timm's ``PrefetchLoader``, apex's ``data_prefetcher``) still get the objects
they call. It needs nothing but the standard library, so every layer can use it.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["SynchronousStream"]


class SynchronousStream:
    """A stream whose every operation is complete at once: waits and synchronisation are no-ops.

    Subclasses set :attr:`event_type`, the event :meth:`record_event` makes (it must have
    ``record(stream)``).
    """

    event_type: ClassVar[Any] = None

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.priority = priority

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        """Always complete."""
        return True

    def wait_stream(self, stream: Any) -> None:
        """Nothing to wait for."""

    def wait_event(self, event: Any) -> None:
        """Nothing to wait for."""

    def record_event(self, event: Any = None) -> Any:
        """Record ``event`` (a new :attr:`event_type` by default) now."""
        event = event if event is not None else type(self).event_type()
        event.record(self)
        return event

    def __enter__(self) -> SynchronousStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None
