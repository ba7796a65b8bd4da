from neuron_workbench.run.cuda_module import HostEvent, HostStream
from neuron_workbench.synchronous import SynchronousStream


def test_a_synchronous_stream_is_done_at_once_and_records_its_own_events():
    side = HostStream(priority=-1)
    assert isinstance(side, SynchronousStream) and side.priority == -1
    with side as entered:
        assert entered is side
    side.wait_stream(HostStream())
    side.synchronize()
    assert side.query()
    start, end = side.record_event(), side.record_event()
    assert type(start) is HostEvent and start.query()
    assert start.elapsed_time(end) >= 0
    mine = HostEvent(enable_timing=True)
    assert side.record_event(mine) is mine
