"""The event log reads back exactly the tuples appended, whether they are still recent or packed."""

from __future__ import annotations

from dist_lib.engine.eventlog import EventLog

GROUP = tuple(range(1024))  # a world group: kept by identity, never hashed per event
PAIR = (3, 4)


def _events():
    return [
        (0, "forward", "compute", 0.0, 1.5, 0, 0b11, 0, 3.0e9, None, 0, ""),
        (0, "forward", "compute", 1.5, 2.5, 0, 0b11, 0, 3.0e9, None, 0, "recompute"),
        (1, "all_reduce", "collective", 2.5, 4.0, 3, (1 << 1000) - 1, 4096, 0.0, GROUP, 7, "weight_grad"),
        (3, "send", "p2p", 4.0, 4.25, 2, 1 << 70, 512, 0.0, PAIR, 2**31 - 1, "activation"),
        (4, "recv", "p2p", 4.0, 4.25, 2, 1 << 70, 512, 0.0, PAIR, 2**31 - 1, "activation"),
        (2, "my_op", "compute", 5.0, 6.0, 1, 1, 0, 1.0, None, 0, "selective"),  # an op the log has not seen
    ]


def test_packed_and_recent_events_read_back_as_appended():
    log = EventLog()
    events = _events()
    for e in events[:4]:
        log.append(e)
    log.pack()
    for e in events[4:]:
        log.append(e)
    assert list(log) == events and len(log) == len(events)
    assert [log[i] for i in range(len(events))] == events and log[-1] == events[-1] and log[1:3] == events[1:3]
    assert log[2][9] is GROUP  # the very tuple: one reference for all the group's events
    log.pack()
    assert list(log) == events and log[3][9] is PAIR and log[4][9] is PAIR


def test_events_of_one_kind_share_a_row_of_the_kind_table():
    """Op, stream, layer, bytes, FLOPs, peers and detail are stored once per distinct combination."""
    log = EventLog()
    events = _events()
    for step in range(3):  # the same kinds again, on other ranks and at other times
        for e in events:
            log.append((e[0] + step, *e[1:3], e[3] + step, e[4] + step, *e[5:]))
        log.pack()
    assert len(log) == 3 * len(events) and len(log._kinds[0]) == len(events)
    assert log[len(events) + 2] == (2, *events[2][1:3], 3.5, 5.0, *events[2][5:])
    other = tuple(range(1024))  # equal to GROUP but another group's tuple: another kind, kept as given
    log.append((*events[2][:9], other, 8, events[2][11]))
    log.pack()
    assert len(log._kinds[0]) == len(events) + 1 and log[-1][9] is other


def test_batches_packed_either_way_read_back_as_appended():
    """A batch with a field of an unexpected type (an int time) is packed by the general path; the
    batches around it by the fast one (in C when built). They share one kind table."""
    log = EventLog()
    events = _events()
    odd = (5, "forward", "compute", 7, 8, 0, 0b11, 0, 3.0e9, None, 0, "")  # int times
    batches = [events[:3], [odd, *events[3:]], events]
    for batch in batches:
        for e in batch:
            log.append(e)
        log.pack()
    appended = [e for batch in batches for e in batch]
    assert list(log) == appended and [log[i] for i in range(len(log))] == appended
    assert log[3][3] == 7.0 and type(log[3][3]) is float  # a packed time is a float
    assert log[2][9] is GROUP and log[-4][9] is GROUP



def test_busy_seconds_sums_each_ranks_events_of_one_stream():
    log = EventLog()
    for e in _events():
        log.append(e)
    # rank 0: two forwards of 1.5 s and 1.0 s; rank 2: one op of 1.0 s; the rest no compute
    assert log.busy_seconds("compute", 5) == [2.5, 0.0, 1.0, 0.0, 0.0]
    assert log.busy_seconds("p2p", 5) == [0.0, 0.0, 0.0, 0.25, 0.25]
    assert EventLog().busy_seconds("compute", 2) == [0.0, 0.0]
