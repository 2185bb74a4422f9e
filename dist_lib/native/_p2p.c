/* C twins of the point-to-point message path: `Model.send` and `Model.recv` (`p2p.issue_send`,
 * `p2p.issue_recv` with `_match` and `_start`) and `p2p._finish` (a message's end).
 *
 * As in `_tensor_ops.c`, the common valid call is handled exactly as the Python does it (same checks, same Work
 * fields, same channel books, the same pairing and start, the same events, wake-ups and frees in the same
 * order), and every other call goes to the Python, which stays the specification: a keyword, a peer or
 * tensor that fails a check (errors are always Python's), the first message on a new channel (Python opens
 * it), a tensor class whose fields Python has not read yet. Nothing is changed before the fast path is sure
 * to finish, so the Python starts from the same state. Transfers are made and scheduled through their
 * Python-visible names (`p2p.Transfer`, `Engine.schedule`), whichever implementation those have.
 */
#include "_common.h"

enum { SEND, RECV };

static struct {
    PyTypeObject *Work, *Channel, *Pending, *Tensor, *Deque;
    PyObject *py_send, *py_recv; /* the Python twins of the methods */
    PyObject *py_finish, *py_start;            /* p2p._finish and p2p._start */
    PyObject *field_getters;                   /* comm._FIELD_GETTERS */
    PyObject *p2p_time, *Transfer, *finish;    /* costs.p2p_time, p2p.Transfer, the C finish */
    PyObject *deque_append, *deque_popleft;
    PyObject *docs;
    /* Model */
    Py_ssize_t m_engine, m_state, m_mem, m_world;
    /* RankState */
    Py_ssize_t s_rank, s_clock, s_p2p_end;
    /* Work */
    Py_ssize_t w_engine, w_rank, w_op, w_issue, w_end, w_result, w_input, w_future, w_peer;
    /* Channel */
    Py_ssize_t c_peers, c_sends, c_recvs, c_free, c_link, c_usage, c_busy, c_ready, c_started, c_durations;
    /* comm._Pending */
    Py_ssize_t p_cls, p_values, p_nbytes, p_layer;
    /* Tensor */
    Py_ssize_t t_rank, t_layer, t_samples;
    PyObject *s_send, *s_recv, *s_p2p, *s_schedule, *s_wake, *s_owner, *s_start, *s_end, *s_next_op_id, *s_ranks,
        *s_events, *s_recent, *s_kind, *s_channels_from, *zero_float, *one;
} P;

/* ---- the message path ------------------------------------------------------------------------------ */

/* engine.channels_from[src].get(dst): the channel, borrowed, if it exists and is the Python class. */
static PyObject *find_channel(PyObject *engine, long src, PyObject *dst) {
    PyObject *by_src = PyObject_GetAttr(engine, P.s_channels_from);
    if (!by_src) return NULL;
    PyObject *channel = NULL;
    if (PyList_CheckExact(by_src) && src < PyList_GET_SIZE(by_src)) {
        PyObject *by_dst = PyList_GET_ITEM(by_src, src);
        if (PyDict_CheckExact(by_dst)) channel = PyDict_GetItemWithError(by_dst, dst);
    }
    Py_DECREF(by_src); /* the engine holds the list, the list the dicts, the dicts the channels */
    if (!channel || Py_TYPE(channel) != P.Channel) return NULL;
    PyObject *sends = SLOT(channel, P.c_sends), *recvs = SLOT(channel, P.c_recvs), *ready = SLOT(channel, P.c_ready);
    if (!sends || !recvs || !ready || Py_TYPE(sends) != P.Deque || Py_TYPE(recvs) != P.Deque ||
        Py_TYPE(ready) != P.Deque || !SLOT(channel, P.c_peers) || !SLOT(channel, P.c_durations) ||
        !PyDict_CheckExact(SLOT(channel, P.c_durations)))
        return NULL;
    return channel;
}

static PyObject *deque_call(PyObject *method, PyObject *deque, PyObject *item) {
    PyObject *args[2] = {deque, item};
    return PyObject_Vectorcall(method, args, item ? 2 : 1, NULL);
}

/* `comm._Pending(tensor)`: the class, fields after `rank` (a stash as None), bytes and layer. Python
 * builds it for a class whose field getter it has not made yet. */
static PyObject *new_pending(PyObject *tensor) {
    PyTypeObject *type = Py_TYPE(tensor);
    PyObject *getter = PyDict_GetItemWithError(P.field_getters, (PyObject *)type);
    if (!getter) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_CallOneArg((PyObject *)P.Pending, tensor);
    }
    if (!PyTuple_CheckExact(getter) || PyTuple_GET_SIZE(getter) != 2) {
        PyErr_SetString(PyExc_TypeError, "comm._FIELD_GETTERS holds (getter, stashed) pairs");
        return NULL;
    }
    PyObject *values = PyObject_CallOneArg(PyTuple_GET_ITEM(getter, 0), tensor);
    if (!values) return NULL;
    if (!PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) < 2) { /* one field: the getter gives it bare */
        Py_DECREF(values);
        return PyObject_CallOneArg((PyObject *)P.Pending, tensor);
    }
    int stashed = PyObject_IsTrue(PyTuple_GET_ITEM(getter, 1));
    if (stashed < 0) { Py_DECREF(values); return NULL; }
    if (stashed) { /* values[:-1] + (None,) */
        Py_ssize_t n = PyTuple_GET_SIZE(values);
        PyObject *without = PyTuple_New(n);
        if (!without) { Py_DECREF(values); return NULL; }
        for (Py_ssize_t i = 0; i < n - 1; i++) PyTuple_SET_ITEM(without, i, Py_NewRef(PyTuple_GET_ITEM(values, i)));
        PyTuple_SET_ITEM(without, n - 1, Py_NewRef(Py_None));
        Py_SETREF(values, without);
    }
    PyObject *nbytes = PyLong_FromLongLong(BUFFER_NBYTES((Buffer *)tensor));
    PyObject *pending = nbytes ? P.Pending->tp_alloc(P.Pending, 0) : NULL;
    if (!pending) { Py_DECREF(values); Py_XDECREF(nbytes); return NULL; }
    SLOT(pending, P.p_cls) = Py_NewRef((PyObject *)type);
    SLOT(pending, P.p_values) = values;
    SLOT(pending, P.p_nbytes) = nbytes;
    SLOT(pending, P.p_layer) = Py_NewRef(SLOT(tensor, P.t_layer));
    return pending;
}

/* `p2p._start`: the channel takes a matched pair; its transfer starts once both ends have issued and the
 * channel is free. Python's for anything off the common case. */
static int start_pair(PyObject *engine, PyObject *channel, PyObject *send, PyObject *recv) {
    PyObject *a = SLOT(send, P.w_issue), *b = SLOT(recv, P.w_issue), *free = SLOT(channel, P.c_free);
    PyObject *tensor = SLOT(send, P.w_input), *started = SLOT(channel, P.c_started);
    long count = small_int(started, -1);
    if (!a || !b || !free || !PyFloat_CheckExact(a) || !PyFloat_CheckExact(b) || !PyFloat_CheckExact(free) ||
        !tensor || !PyObject_TypeCheck(tensor, P.Tensor) || count < 0 || count >= LONG_MAX - 1 ||
        !SLOT(channel, P.c_link) || !SLOT(channel, P.c_usage)) {
        PyObject *args[4] = {engine, channel, send, recv};
        PyObject *r = PyObject_Vectorcall(P.py_start, args, 4, NULL);
        Py_XDECREF(r);
        return r ? 0 : -1;
    }
    /* max(send.issue, recv.issue, channel.free): the first of the largest */
    PyObject *at = a;
    if (PyFloat_AS_DOUBLE(b) > PyFloat_AS_DOUBLE(at)) at = b;
    if (PyFloat_AS_DOUBLE(free) > PyFloat_AS_DOUBLE(at)) at = free;
    Py_INCREF(at); /* the slots may change below */
    PyObject *nbytes = PyLong_FromLongLong(BUFFER_NBYTES((Buffer *)tensor));
    PyObject *next = nbytes ? PyLong_FromLong(count + 1) : NULL;
    PyObject *duration = NULL, *key = NULL, *owner = NULL, *transfer = NULL, *done = NULL;
    if (!next) goto fail;
    PyObject *durations = SLOT(channel, P.c_durations);
    duration = PyDict_GetItemWithError(durations, nbytes);
    if (duration) {
        Py_INCREF(duration);
    } else {
        if (PyErr_Occurred()) goto fail;
        PyObject *args[2] = {nbytes, SLOT(channel, P.c_link)};
        duration = PyObject_Vectorcall(P.p2p_time, args, 2, NULL);
        if (!duration || PyDict_SetItem(durations, nbytes, duration) < 0) goto fail;
    }
    Py_SETREF(SLOT(channel, P.c_busy), Py_NewRef(Py_True));
    Py_SETREF(SLOT(channel, P.c_started), Py_NewRef(next));
    key = PyTuple_Pack(3, P.one, SLOT(channel, P.c_peers), next);
    owner = key ? PyTuple_Pack(3, channel, send, recv) : NULL;
    if (!owner) goto fail;
    PyObject *args[6] = {at, duration, SLOT(channel, P.c_usage), P.finish, owner, key};
    transfer = PyObject_Vectorcall(P.Transfer, args, 6, NULL);
    if (!transfer) goto fail;
    PyObject *call[2] = {engine, transfer};
    done = PyObject_VectorcallMethod(P.s_schedule, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
fail:
    Py_DECREF(at);
    Py_XDECREF(nbytes);
    Py_XDECREF(next);
    Py_XDECREF(duration);
    Py_XDECREF(key);
    Py_XDECREF(owner);
    Py_XDECREF(transfer);
    if (!done) return -1;
    Py_DECREF(done);
    return 0;
}

/* `p2p._match`: pair the channel's queued sends and recvs in order and start (or queue) each pair. */
static int match(PyObject *engine, PyObject *channel) {
    PyObject *sends = SLOT(channel, P.c_sends), *recvs = SLOT(channel, P.c_recvs);
    while (PyObject_Size(sends) > 0 && PyObject_Size(recvs) > 0) {
        PyObject *send = deque_call(P.deque_popleft, sends, NULL);
        PyObject *recv = send ? deque_call(P.deque_popleft, recvs, NULL) : NULL;
        int failed = !recv;
        if (!failed) {
            PyObject *input = Py_TYPE(send) == P.Work && Py_TYPE(recv) == P.Work ? SLOT(send, P.w_input) : NULL;
            PyObject *pending = input ? new_pending(input) : NULL;
            if (!input) PyErr_SetString(PyExc_TypeError, "a channel's queues hold the Works of its sends and recvs");
            failed = !pending;
            if (pending) Py_XSETREF(SLOT(recv, P.w_result), pending);
        }
        if (!failed) {
            int busy = PyObject_IsTrue(SLOT(channel, P.c_busy));
            if (busy > 0) {
                PyObject *pair = PyTuple_Pack(2, send, recv);
                PyObject *r = pair ? deque_call(P.deque_append, SLOT(channel, P.c_ready), pair) : NULL;
                Py_XDECREF(pair);
                failed = !r;
                Py_XDECREF(r);
            } else {
                failed = busy < 0 || start_pair(engine, channel, send, recv) < 0;
            }
        }
        Py_XDECREF(send);
        Py_XDECREF(recv);
        if (failed) return -1;
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* `issue_send` / `issue_recv` once the checks passed (the rank state's rank and clock are set): a Work on
 * the channel's queue, matched at once when the other end is waiting. */
static PyObject *post(int op, PyObject *self, PyObject *channel, PyObject *input) {
    PyObject *engine = SLOT(self, P.m_engine), *state = SLOT(self, P.m_state);
    PyObject *rank = SLOT(state, P.s_rank), *clock = SLOT(state, P.s_clock);
    PyObject *work = P.Work->tp_alloc(P.Work, 0);
    if (!work) return NULL;
    struct { Py_ssize_t offset; PyObject *value; } fields[] = {
        {P.w_engine, engine}, {P.w_rank, rank}, {P.w_op, op == SEND ? P.s_send : P.s_recv}, {P.w_issue, clock},
        {P.w_end, Py_None}, {P.w_result, Py_None}, {P.w_input, input}, {P.w_future, Py_None},
        {P.w_peer, SLOT(channel, P.c_peers)},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        SLOT(work, fields[i].offset) = Py_NewRef(fields[i].value);
    PyObject *mine = SLOT(channel, op == SEND ? P.c_sends : P.c_recvs);
    PyObject *other = SLOT(channel, op == SEND ? P.c_recvs : P.c_sends);
    PyObject *r = deque_call(P.deque_append, mine, work);
    if (!r) { Py_DECREF(work); return NULL; }
    Py_DECREF(r);
    Py_ssize_t waiting = PyObject_Size(other);
    if (waiting < 0 || (waiting > 0 && match(engine, channel) < 0)) { Py_DECREF(work); return NULL; }
    return work;
}

/* A peer rank this rank may message: an exact int in 0..world-1 other than itself (else -1, also when the
 * rank state has no rank or clock). */
static long peer_of(PyObject *self, PyObject *peer, long *rank_out) {
    PyObject *state = SLOT(self, P.m_state);
    long rank = SLOT(state, P.s_clock) ? small_int(SLOT(state, P.s_rank), -1) : -1;
    long world = small_int(SLOT(self, P.m_world), -1);
    long p = PyLong_CheckExact(peer) ? small_int(peer, -1) : -1;
    *rank_out = rank;
    return rank < 0 || p < 0 || p >= world || p == rank ? -1 : p;
}

static PyObject *fast_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs != 2 || kwnames) goto slow;
    PyObject *x = args[0], *dst = args[1], *engine = SLOT(self, P.m_engine);
    long rank;
    if (peer_of(self, dst, &rank) < 0 || !PyObject_TypeCheck(x, P.Tensor) ||
        int_eq(SLOT(x, P.t_rank), SLOT(SLOT(self, P.m_state), P.s_rank)) != 1 || buffer_log(x) != SLOT(self, P.m_mem))
        goto slow;
    PyObject *channel = find_channel(engine, rank, dst);
    if (!channel) goto slow;
    return post(SEND, self, channel, x);
slow:
    return fallback(P.py_send, self, args, nargs, kwnames);
}

static PyObject *fast_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs != 1 || kwnames) goto slow;
    PyObject *src = args[0], *engine = SLOT(self, P.m_engine);
    long rank, from = peer_of(self, src, &rank);
    if (from < 0) goto slow;
    PyObject *channel = find_channel(engine, from, SLOT(SLOT(self, P.m_state), P.s_rank));
    if (!channel) goto slow;
    return post(RECV, self, channel, Py_None);
slow:
    return fallback(P.py_recv, self, args, nargs, kwnames);
}

/* ---- a message's end ----------------------------------------------------------------------------- */

static int set_float_if_later(PyObject *obj, Py_ssize_t offset, PyObject *end) {
    PyObject *now = SLOT(obj, offset);
    if (!now) return -1;
    int later = PyObject_RichCompareBool(end, now, Py_GT);
    if (later > 0) Py_SETREF(SLOT(obj, offset), Py_NewRef(end));
    return later < 0 ? -1 : 0;
}

/* `p2p._finish(engine, transfer)`: the message arrived (its end is final). */
static PyObject *finish(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "finish(engine, transfer)");
        return NULL;
    }
    PyObject *engine = args[0], *transfer = args[1];
    PyObject *owner = PyObject_GetAttr(transfer, P.s_owner);
    if (!owner) return NULL;
    PyObject *channel = NULL, *send = NULL, *recv = NULL;
    if (PyTuple_CheckExact(owner) && PyTuple_GET_SIZE(owner) == 3) {
        channel = PyTuple_GET_ITEM(owner, 0), send = PyTuple_GET_ITEM(owner, 1), recv = PyTuple_GET_ITEM(owner, 2);
    }
    PyObject *tensor = send && Py_TYPE(send) == P.Work ? SLOT(send, P.w_input) : NULL;
    if (!channel || Py_TYPE(channel) != P.Channel || Py_TYPE(recv) != P.Work || !tensor ||
        !PyObject_TypeCheck(tensor, P.Tensor) || !SLOT(channel, P.c_ready) ||
        Py_TYPE(SLOT(channel, P.c_ready)) != P.Deque || !SLOT(channel, P.c_peers) ||
        /* a message no rank waits on lands in a buffer on its receiver now: `p2p.land`, in Python */
        (SLOT(recv, P.w_future) == Py_None && SLOT(recv, P.w_result) &&
         Py_TYPE(SLOT(recv, P.w_result)) == P.Pending)) {
        Py_DECREF(owner);
        return PyObject_Vectorcall(P.py_finish, args, nargs, NULL);
    }
    Py_INCREF(channel);
    Py_INCREF(send);
    Py_INCREF(recv);
    Py_DECREF(owner);
    PyObject *start = NULL, *end = NULL, *next_id = NULL, *ranks = NULL, *log = NULL,
             *recent = NULL, *nbytes = NULL, *kind = NULL, *result = NULL, *layer = NULL, *samples = NULL;
    if (PyObject_SetAttr(transfer, P.s_owner, Py_None) < 0) goto done;
    double start_s, end_s;
    if (transfer_times(transfer, &start_s, &end_s)) {
        if (!(start = PyFloat_FromDouble(start_s)) || !(end = PyFloat_FromDouble(end_s))) goto done;
    } else if (!(start = PyObject_GetAttr(transfer, P.s_start)) || !(end = PyObject_GetAttr(transfer, P.s_end))) {
        goto done;
    }
    /* what the events name of the tensor, held without it: the stream lets go of it below */
    layer = Py_NewRef(SLOT(tensor, P.t_layer));
    samples = Py_NewRef(SLOT(tensor, P.t_samples));
    if (!(nbytes = PyLong_FromLongLong(BUFFER_NBYTES((Buffer *)tensor))) ||
        !(kind = PyObject_GetAttr(tensor, P.s_kind)))
        goto done;
    tensor = NULL;
    Py_SETREF(SLOT(channel, P.c_free), Py_NewRef(end));
    Py_SETREF(SLOT(channel, P.c_busy), Py_NewRef(Py_False));
    Py_XSETREF(SLOT(send, P.w_end), Py_NewRef(end));
    Py_XSETREF(SLOT(recv, P.w_end), Py_NewRef(end));
    Py_XSETREF(SLOT(send, P.w_result), Py_NewRef(Py_None));
    if (!(next_id = take_op_id(engine, P.s_next_op_id))) goto done;
    if (!(ranks = slot_get(engine, P.s_ranks)) || !(log = slot_get(engine, P.s_events)) ||
        !(recent = slot_get(log, P.s_recent)))
        goto done;
    if (!PyList_CheckExact(ranks) || !PyList_CheckExact(recent)) {
        PyErr_SetString(PyExc_TypeError, "engine.ranks and engine.events.recent must be lists");
        goto done;
    }
    PyObject *works[2] = {send, recv};
    for (int i = 0; i < 2; i++) {
        PyObject *work = works[i], *rank = SLOT(work, P.w_rank);
        Py_ssize_t r = rank ? PyNumber_AsSsize_t(rank, NULL) : -1;
        if (r < 0 || r >= PyList_GET_SIZE(ranks)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a message's rank is not in engine.ranks");
            goto done;
        }
        if (set_float_if_later(PyList_GET_ITEM(ranks, r), P.s_p2p_end, end) < 0) goto done;
        PyObject *items[12] = {rank, SLOT(work, P.w_op), P.s_p2p, start, end, layer, samples, nbytes, P.zero_float,
                               SLOT(channel, P.c_peers), next_id, kind};
        if (append_event(recent, items) < 0) goto done;
    }
    for (int i = 0; i < 2; i++) {
        if (SLOT(works[i], P.w_future) == Py_None) continue; /* no rank waits on it */
        PyObject *r = engine_wake(engine, works[i]);
        if (!r) goto done;
        Py_DECREF(r);
    }
    /* the sender's stream lets go of the tensor at `end` (or the sender's clock, if later) */
    {
        Py_ssize_t r = PyNumber_AsSsize_t(SLOT(send, P.w_rank), NULL);
        if (r < 0 || r >= PyList_GET_SIZE(ranks)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a message's rank is not in engine.ranks");
            goto done;
        }
        PyObject *state = PyList_GET_ITEM(ranks, r);
        PyObject *clock = SLOT(state, P.s_clock);
        if (!clock) goto done;
        Py_INCREF(clock);
        int later = PyObject_RichCompareBool(end, clock, Py_GT);
        if (later < 0) { Py_DECREF(clock); goto done; }
        if (later) Py_SETREF(SLOT(state, P.s_clock), Py_NewRef(end));
        Py_XSETREF(SLOT(send, P.w_input), Py_NewRef(Py_None));
        Py_CLEAR(send);
        Py_XSETREF(SLOT(state, P.s_clock), clock); /* takes our reference */
    }
    PyObject *ready = SLOT(channel, P.c_ready);
    Py_ssize_t queued = PyObject_Size(ready);
    if (queued < 0) goto done;
    if (queued) {
        PyObject *pair = deque_call(P.deque_popleft, ready, NULL);
        if (!pair) goto done;
        int failed = !PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                     start_pair(engine, channel, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) < 0;
        if (failed && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "channel.ready holds (send, recv) pairs");
        Py_DECREF(pair);
        if (failed) goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(channel);
    Py_XDECREF(send);
    Py_XDECREF(recv);
    Py_XDECREF(start);
    Py_XDECREF(end);
    Py_XDECREF(next_id);
    Py_XDECREF(ranks);
    Py_XDECREF(log);
    Py_XDECREF(recent);
    Py_XDECREF(nbytes);
    Py_XDECREF(kind);
    Py_XDECREF(layer);
    Py_XDECREF(samples);
    return result;
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef send_def = {"send", (PyCFunction)(void (*)(void))fast_send, METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef recv_def = {"recv", (PyCFunction)(void (*)(void))fast_recv, METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef finish_def = {"_finish", (PyCFunction)(void (*)(void))finish, METH_FASTCALL,
                                 "_finish(engine, transfer)\n--\n\nThe message arrived (its end is final): the C "
                                 "twin of p2p._finish."};

/* module.name, which must be a class when `is_type`. */
static int get_attr(PyObject *module, const char *name, int is_type, PyObject **out) {
    PyObject *value = PyObject_GetAttrString(module, name);
    if (!value) return -1;
    if (is_type && !PyType_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a class", module, name);
        Py_DECREF(value);
        return -1;
    }
    Py_XSETREF(*out, value);
    return 0;
}

/* The names and constants the twin reads, made once, by the first install. */
static int p2p_names(void) {
    if (P.s_send) return 0;
    struct { PyObject **out; const char *text; } strings[] = {
        {&P.s_send, "send"}, {&P.s_recv, "recv"}, {&P.s_p2p, "p2p"}, {&P.s_schedule, "schedule"},
        {&P.s_wake, "wake"}, {&P.s_owner, "owner"}, {&P.s_start, "start"}, {&P.s_end, "end"},
        {&P.s_next_op_id, "next_op_id"}, {&P.s_ranks, "ranks"}, {&P.s_events, "events"}, {&P.s_recent, "recent"},
        {&P.s_kind, "kind"}, {&P.s_channels_from, "channels_from"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    if (!(P.zero_float = PyFloat_FromDouble(0.0)) || !(P.one = PyLong_FromLong(1))) return -1;
    return 0;
}

PyObject *install_p2p_ops(PyObject *module, PyObject *args) {
    if (p2p_names() < 0) return NULL;
    PyObject *Model, *RankState, *MemoryTracker, *p2p, *comm, *tensors, *docs;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!:install_p2p_ops", &PyType_Type, &Model, &PyType_Type, &RankState,
                          &PyType_Type, &MemoryTracker, &PyModule_Type, &p2p, &PyModule_Type, &comm, &PyModule_Type,
                          &tensors, &PyDict_Type, &docs))
        return NULL;
    PyObject *costs = NULL, *collections = NULL;
    struct { PyObject *module; const char *name; int is_type; PyObject **out; } attrs[] = {
        {comm, "Work", 1, (PyObject **)&P.Work}, {comm, "_Pending", 1, (PyObject **)&P.Pending},
        {comm, "_FIELD_GETTERS", 0, &P.field_getters}, {p2p, "Channel", 1, (PyObject **)&P.Channel},
        {p2p, "Transfer", 0, &P.Transfer}, {p2p, "_finish", 0, &P.py_finish}, {p2p, "_start", 0, &P.py_start},
        {p2p, "network", 0, &costs}, {tensors, "Tensor", 1, (PyObject **)&P.Tensor},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        if (get_attr(attrs[i].module, attrs[i].name, attrs[i].is_type, attrs[i].out) < 0) goto fail;
    if (!PyDict_Check(P.field_getters) || !PyFunction_Check(P.py_finish)) {
        PyErr_SetString(PyExc_TypeError, "install_p2p_ops: comm._FIELD_GETTERS must be a dict and p2p._finish the "
                                         "Python function (installed twice?)");
        goto fail;
    }
    if (get_attr(costs, "p2p_time", 0, &P.p2p_time) < 0) goto fail;
    if (!(collections = PyImport_ImportModule("collections")) ||
        get_attr(collections, "deque", 1, (PyObject **)&P.Deque) < 0 ||
        get_attr((PyObject *)P.Deque, "append", 0, &P.deque_append) < 0 ||
        get_attr((PyObject *)P.Deque, "popleft", 0, &P.deque_popleft) < 0)
        goto fail;
    PyObject *Work = (PyObject *)P.Work, *Channel = (PyObject *)P.Channel, *Pending = (PyObject *)P.Pending;
    PyObject *Tensor = (PyObject *)P.Tensor;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Model, "_engine", &P.m_engine}, {Model, "_state", &P.m_state}, {Model, "_mem", &P.m_mem},
        {Model, "world_size", &P.m_world},
        {RankState, "rank", &P.s_rank}, {RankState, "clock", &P.s_clock}, {RankState, "p2p_end", &P.s_p2p_end},
        {Work, "engine", &P.w_engine}, {Work, "rank", &P.w_rank}, {Work, "op", &P.w_op}, {Work, "issue", &P.w_issue},
        {Work, "end", &P.w_end}, {Work, "result", &P.w_result}, {Work, "input", &P.w_input},
        {Work, "future", &P.w_future}, {Work, "peer", &P.w_peer},
        {Channel, "peers", &P.c_peers}, {Channel, "sends", &P.c_sends}, {Channel, "recvs", &P.c_recvs},
        {Channel, "free", &P.c_free}, {Channel, "link", &P.c_link}, {Channel, "usage", &P.c_usage},
        {Channel, "busy", &P.c_busy}, {Channel, "ready", &P.c_ready}, {Channel, "started", &P.c_started},
        {Channel, "durations", &P.c_durations},
        {Pending, "cls", &P.p_cls}, {Pending, "values", &P.p_values}, {Pending, "nbytes", &P.p_nbytes},
        {Pending, "layer", &P.p_layer},
        {Tensor, "rank", &P.t_rank}, {Tensor, "layer", &P.t_layer}, {Tensor, "samples", &P.t_samples},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) goto fail;
    if (!P.finish && !(P.finish = PyCFunction_New(&finish_def, NULL))) goto fail;
    Py_XSETREF(P.docs, Py_NewRef(docs));
    if (replace_method(Model, &send_def, &P.py_send, P.docs) < 0 ||
        replace_method(Model, &recv_def, &P.py_recv, P.docs) < 0 ||
        PyObject_SetAttrString(p2p, "_finish", P.finish) < 0)
        goto fail;
    Py_XDECREF(costs);
    Py_XDECREF(collections);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(costs);
    Py_XDECREF(collections);
    return NULL;
}

