/* C twin of the engine's block/wake path, which runs around every communication op a strategy awaits:
 * `Engine._drive` and `_step` (resume each ready rank's coroutine to its next wait), `Work.__await__` on the
 * rank's own coroutine with `Engine.block_direct` and `_register` (block; the last rank to block reaches a
 * quiescence), `Engine.wake` (a work completed: its rank can run again) and `Engine.schedule` (a transfer to
 * the scheduler, once per collective and message). In Python these were about half of the bytecodes of a long
 * pipeline's op.
 *
 * Done exactly as the Python does it, in the same order; anything off that path (a wait inside an asyncio
 * task, a rank to resume with an error, a future to complete, books that are not the Python classes') goes
 * to the Python method, which stays the specification.
 */
#include "_common.h"

static struct {
    PyTypeObject *Engine, *RankState, *Work, *EventLog;
    PyObject *wake_me, *minus_one;
    Py_ssize_t pack_at;
    PyObject *py_wake, *py_drive, *py_await, *py_schedule; /* the Python twins */
    /* Engine */
    Py_ssize_t e_ranks, e_events, e_blocked, e_finished, e_world_size, e_coroutines, e_ready, e_driving,
        e_throw_into, e_stepping, e_thread, e_transfers, e_instant;
    /* Work; RankState; EventLog */
    Py_ssize_t w_engine, w_rank, w_end, w_future, s_waiting, l_recent;
    PyObject *s_pack, *s_add, *s_advance, *s_append, *s_popleft, *s_block_direct, *s_complete, *s_rank_returned,
        *s_rank_failed, *s_await_foreign, *s_step_name;
} D;

/* engine.ranks[rank] when it is a RankState with its list of waits (borrowed), else NULL (never raises) */
static PyObject *state_of(PyObject *engine, PyObject *rank) {
    PyObject *ranks = SLOT(engine, D.e_ranks);
    long r = small_int(rank, -1);
    if (!ranks || !PyList_CheckExact(ranks) || r < 0 || r >= PyList_GET_SIZE(ranks)) return NULL;
    PyObject *state = PyList_GET_ITEM(ranks, r);
    if (Py_TYPE(state) != D.RankState || !SLOT(state, D.s_waiting) || !PyList_CheckExact(SLOT(state, D.s_waiting)))
        return NULL;
    return state;
}

/* obj.<slot at offset> += delta, for an int slot. 0, or -1 with an exception. */
static int add_to(PyObject *obj, Py_ssize_t offset, long delta) {
    PyObject *old = SLOT(obj, offset);
    if (!old) {
        PyErr_SetString(PyExc_AttributeError, "engine counter not set");
        return -1;
    }
    long now = small_int(old, LONG_MIN); /* a counter of ranks: an int far from a long's ends */
    PyObject *sum;
    if (now != LONG_MIN && now > LONG_MIN / 2 && now < LONG_MAX / 2) {
        sum = PyLong_FromLong(now + delta);
    } else {
        PyObject *step = PyLong_FromLong(delta);
        if (!step) return -1;
        sum = PyNumber_Add(old, step);
        Py_DECREF(step);
    }
    if (!sum) return -1;
    Py_SETREF(SLOT(obj, offset), sum);
    return 0;
}

static PyObject *call_method(PyObject *obj, PyObject *name, PyObject *arg1, PyObject *arg2) {
    PyObject *args[3] = {obj, arg1, arg2};
    size_t n = 1 + (arg1 != NULL) + (arg2 != NULL);
    return PyObject_VectorcallMethod(name, args, n | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* ---- Engine.wake ----------------------------------------------------------------------------------- */

static PyObject *wake(PyObject *engine, PyObject *work) {
    if (Py_TYPE(engine) != D.Engine || Py_TYPE(work) != D.Work) goto slow;
    PyObject *future = SLOT(work, D.w_future), *rank = SLOT(work, D.w_rank);
    if (future == Py_None) Py_RETURN_NONE;
    if (future != D.wake_me || !rank) goto slow; /* an asyncio future to complete, or several waits: the Python */
    PyObject *state = state_of(engine, rank);
    if (!state) goto slow;
    PyObject *waiting = SLOT(state, D.s_waiting);
    Py_ssize_t n = PyList_GET_SIZE(waiting), i = 0;
    while (i < n && PyList_GET_ITEM(waiting, i) != work) i++;
    if (i == n) goto slow; /* (a Work equals only itself: the Python's `remove` raises) */
    if (PySequence_DelItem(waiting, i) < 0) return NULL;
    if (PyList_GET_SIZE(waiting) == 0 && add_to(engine, D.e_blocked, -1) < 0) return NULL;
    int driving = int_eq(rank, SLOT(engine, D.e_driving)); /* the rank that reached this quiescence runs on */
    if (driving < 0) return NULL;
    if (!driving) {
        PyObject *ready = SLOT(engine, D.e_ready);
        if (!ready) goto slow;
        PyObject *r = call_method(ready, D.s_append, rank, NULL);
        if (!r) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
slow:;
    PyObject *args[2] = {engine, work};
    return PyObject_Vectorcall(D.py_wake, args, 2, NULL);
}

static PyMethodDef wake_def; /* (below) */
static PyObject *str_wake;

PyObject *engine_wake(PyObject *engine, PyObject *work) {
    if (!str_wake && !(str_wake = PyUnicode_InternFromString("wake"))) return NULL;
    PyObject *method = _PyType_Lookup(Py_TYPE(engine), str_wake);
    if (method && Py_IS_TYPE(method, &PyMethodDescr_Type) && ((PyMethodDescrObject *)method)->d_method == &wake_def)
        return wake(engine, work); /* this file's, installed: no method call */
    PyObject *call[2] = {engine, work};
    return PyObject_VectorcallMethod(str_wake, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* ---- Engine.schedule ------------------------------------------------------------------------------ */

static PyObject *schedule(PyObject *engine, PyObject *transfer) {
    double start, end;
    PyObject *transfers = Py_TYPE(engine) == D.Engine ? SLOT(engine, D.e_transfers) : NULL;
    if (!transfers || !transfer_times(transfer, &start, &end)) {
        PyObject *args[2] = {engine, transfer};
        return PyObject_Vectorcall(D.py_schedule, args, 2, NULL);
    }
    if (end == start) Py_XSETREF(SLOT(engine, D.e_instant), Py_NewRef(Py_True));
    PyObject *r = PyObject_CallMethodOneArg(transfers, D.s_add, transfer);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* ---- Work.__await__ on the rank's own coroutine -------------------------------------------------------- */

/* `Engine.block_direct(state, work)` and `_register`: the work's rank waits on it; the last rank to block
 * reaches a quiescence, which may complete the work at once. 0, or -1 with an exception. */
static int block(PyObject *work) {
    PyObject *engine = SLOT(work, D.w_engine), *state = state_of(engine, SLOT(work, D.w_rank));
    PyObject *events = SLOT(engine, D.e_events);
    PyObject *recent = events && Py_TYPE(events) == D.EventLog ? SLOT(events, D.l_recent) : NULL;
    long blocked = small_int(SLOT(engine, D.e_blocked), -1), finished = small_int(SLOT(engine, D.e_finished), -1);
    long world = small_int(SLOT(engine, D.e_world_size), -1);
    if (!state || !recent || !PyList_CheckExact(recent) || blocked < 0 || finished < 0 || world < 0 ||
        SLOT(work, D.w_future) != Py_None) { /* (a task of the rank waits on it too: the Python) */
        PyObject *python_state = PySequence_GetItem(SLOT(engine, D.e_ranks), small_int(SLOT(work, D.w_rank), 0));
        if (!python_state) return -1;
        PyObject *r = call_method(engine, D.s_block_direct, python_state, work);
        Py_DECREF(python_state);
        Py_XDECREF(r);
        return r ? 0 : -1;
    }
    Py_XSETREF(SLOT(work, D.w_future), Py_NewRef(D.wake_me));
    PyObject *waiting = SLOT(state, D.s_waiting);
    if (PyList_GET_SIZE(waiting) == 0) {
        if (add_to(engine, D.e_blocked, 1) < 0) return -1;
        blocked++;
    }
    if (PyList_Append(waiting, work) < 0) return -1;
    if (pending_events(recent) >= D.pack_at) {
        PyObject *r = call_method(events, D.s_pack, NULL, NULL);
        if (!r) return -1;
        Py_DECREF(r);
    }
    if (blocked + finished == world) {
        PyObject *r = call_method(engine, D.s_advance, NULL, NULL);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* What `await work` iterates on the rank's own coroutine: the Python generator's two steps, block (and
 * yield WAKE_ME to the engine unless the quiescence completed the work) and complete. */
typedef struct {
    PyObject_HEAD
    PyObject *work;
    int step; /* 0: not started, 1: waiting for the engine to resume it, 2: done */
} Awaiter;

static PySendResult awaiter_send(Awaiter *self, PyObject *arg, PyObject **result) {
    PyObject *work = self->work;
    if (self->step == 2) {
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    if (self->step == 0 && SLOT(work, D.w_end) == Py_None) {
        if (block(work) < 0) {
            self->step = 2;
            *result = NULL;
            return PYGEN_ERROR;
        }
        if (SLOT(work, D.w_end) == Py_None) { /* (else the quiescence it reached completed it) */
            self->step = 1;
            *result = Py_NewRef(D.wake_me);
            return PYGEN_NEXT;
        }
    }
    self->step = 2;
    *result = call_method(work, D.s_complete, NULL, NULL);
    return *result ? PYGEN_RETURN : PYGEN_ERROR;
}

/* the same as an iterator (what `await` uses while a trace function is set), ending in StopIteration */
static PyObject *awaiter_next(Awaiter *self) {
    PyObject *result;
    PySendResult sent = awaiter_send(self, Py_None, &result);
    if (sent != PYGEN_RETURN) return result;
    if (result == Py_None) {
        Py_DECREF(result);
        PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, result);
    Py_DECREF(result);
    if (stop) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

static PyObject *awaiter_send_method(Awaiter *self, PyObject *arg) {
    return awaiter_next(self);
}

static void awaiter_dealloc(Awaiter *self) {
    Py_XDECREF(self->work);
    PyObject_Free(self);
}

static PyAsyncMethods awaiter_async = {.am_send = (sendfunc)awaiter_send};

static PyMethodDef awaiter_methods[] = {
    {"send", (PyCFunction)awaiter_send_method, METH_O, "Resume the await (the value is ignored)."},
    {NULL}};

static PyTypeObject AwaiterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "dist_lib._buffers.WorkAwait",
    .tp_basicsize = sizeof(Awaiter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "`await work` on the work's own rank's coroutine (the C twin of the generator `Work.__await__`).",
    .tp_dealloc = (destructor)awaiter_dealloc,
    .tp_as_async = &awaiter_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)awaiter_next,
    .tp_methods = awaiter_methods,
};

static PyObject *work_await(PyObject *work, PyObject *unused) {
    if (Py_TYPE(work) != D.Work) goto slow;
    PyObject *engine = SLOT(work, D.w_engine);
    if (!engine || Py_TYPE(engine) != D.Engine || !SLOT(work, D.w_end)) goto slow;
    int own = int_eq(SLOT(engine, D.e_driving), SLOT(work, D.w_rank));
    if (own < 0) return NULL;
    if (!own) goto slow; /* another rank's coroutine, or an asyncio task: the Python checks and blocks */
    PyObject *thread = SLOT(engine, D.e_thread);
    if (!thread || !PyLong_CheckExact(thread) || PyLong_AsUnsignedLong(thread) != PyThread_get_thread_ident()) {
        PyErr_Clear();
        goto slow; /* (another thread, while the step's drives this rank: the Python refuses it) */
    }
    Awaiter *awaiter = PyObject_New(Awaiter, &AwaiterType);
    if (!awaiter) return NULL;
    awaiter->work = Py_NewRef(work);
    awaiter->step = 0;
    return (PyObject *)awaiter;
slow:
    return PyObject_CallOneArg(D.py_await, work);
}

/* ---- Engine._drive and _step ----------------------------------------------------------------------- */

/* `Engine._step(rank)`: run rank `rank`'s coroutine to its next wait (or its end). 0, or -1 with an
 * exception (the engine's own, as the Python lets it out). */
static int step(PyObject *engine, PyObject *rank) {
    PyObject *coroutines = SLOT(engine, D.e_coroutines), *throw_into = SLOT(engine, D.e_throw_into);
    long r = small_int(rank, -1);
    if (!coroutines || !PyList_CheckExact(coroutines) || r < 0 || r >= PyList_GET_SIZE(coroutines) ||
        !throw_into || !PyDict_CheckExact(throw_into) || PyDict_GET_SIZE(throw_into)) {
        PyObject *out = call_method(engine, D.s_step_name, rank, NULL);
        Py_XDECREF(out);
        return out ? 0 : -1;
    }
    PyObject *coroutine = PyList_GET_ITEM(coroutines, r);
    if (coroutine == Py_None) return 0; /* closed after a failure */
    Py_INCREF(coroutine);
    Py_XSETREF(SLOT(engine, D.e_driving), Py_NewRef(rank));
    PyObject *yielded;
    PySendResult sent = PyIter_Send(coroutine, Py_None, &yielded);
    Py_DECREF(coroutine);
    Py_XSETREF(SLOT(engine, D.e_driving), Py_NewRef(D.minus_one));
    PyObject *out;
    if (sent == PYGEN_RETURN) {
        Py_DECREF(yielded);
        out = call_method(engine, D.s_rank_returned, rank, NULL);
    } else if (sent == PYGEN_ERROR) { /* the strategy raised: `_rank_failed` names it */
        PyObject *type, *error, *traceback;
        PyErr_Fetch(&type, &error, &traceback);
        PyErr_NormalizeException(&type, &error, &traceback);
        if (traceback) PyException_SetTraceback(error, traceback);
        out = call_method(engine, D.s_rank_failed, rank, error);
        Py_XDECREF(type);
        Py_XDECREF(error);
        Py_XDECREF(traceback);
    } else if (yielded != D.wake_me) {
        out = call_method(engine, D.s_await_foreign, rank, yielded);
        Py_DECREF(yielded);
    } else {
        Py_DECREF(yielded);
        return 0;
    }
    Py_XDECREF(out);
    return out ? 0 : -1;
}

static PyObject *drive(PyObject *engine, PyObject *unused) {
    if (Py_TYPE(engine) != D.Engine || !SLOT(engine, D.e_stepping) || !SLOT(engine, D.e_ready)) {
        PyObject *args[1] = {engine};
        return PyObject_Vectorcall(D.py_drive, args, 1, NULL);
    }
    int stepping = PyObject_IsTrue(SLOT(engine, D.e_stepping));
    if (stepping < 0) return NULL;
    if (stepping) Py_RETURN_NONE; /* already resuming ranks further up the stack: that loop takes this one too */
    Py_XSETREF(SLOT(engine, D.e_stepping), Py_NewRef(Py_True));
    PyObject *ready = Py_NewRef(SLOT(engine, D.e_ready));
    int failed = 0;
    for (;;) {
        Py_ssize_t left = PyObject_Length(ready);
        if (left <= 0) {
            failed = left < 0;
            break;
        }
        PyObject *rank = call_method(ready, D.s_popleft, NULL, NULL);
        if (!rank) {
            failed = 1;
            break;
        }
        failed = step(engine, rank) < 0;
        Py_DECREF(rank);
        if (failed) break;
    }
    Py_DECREF(ready);
    /* (the Python's `finally`: keep a pending exception across the store) */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    Py_XSETREF(SLOT(engine, D.e_stepping), Py_NewRef(Py_False));
    PyErr_Restore(type, value, traceback);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef wake_def = {"wake", (PyCFunction)wake, METH_O, NULL};
static PyMethodDef drive_def = {"_drive", (PyCFunction)drive, METH_NOARGS, NULL};
static PyMethodDef schedule_def = {"schedule", (PyCFunction)schedule, METH_O, NULL};
static PyMethodDef await_def = {"__await__", (PyCFunction)work_await, METH_NOARGS, NULL};

/* The names and constants the twin reads, made once, by the first install. */
static int drive_names(void) {
    if (D.s_pack) return 0;
    struct { PyObject **out; const char *text; } strings[] = {
        {&D.s_pack, "pack"}, {&D.s_add, "add"}, {&D.s_advance, "advance"}, {&D.s_append, "append"}, {&D.s_popleft, "popleft"},
        {&D.s_block_direct, "block_direct"}, {&D.s_complete, "_complete"}, {&D.s_rank_returned, "_rank_returned"},
        {&D.s_rank_failed, "_rank_failed"}, {&D.s_await_foreign, "_await_foreign"}, {&D.s_step_name, "_step"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    if (!(D.minus_one = PyLong_FromLong(-1)) || PyType_Ready(&AwaiterType) < 0) return -1;
    return 0;
}

PyObject *install_drive(PyObject *module, PyObject *args) {
    if (drive_names() < 0) return NULL;
    PyObject *Engine, *RankState, *Work, *EventLog, *wake_me, *twins, *docs;
    Py_ssize_t pack_at;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OnO!O!:install_drive", &PyType_Type, &Engine, &PyType_Type, &RankState,
                          &PyType_Type, &Work, &PyType_Type, &EventLog, &wake_me, &pack_at, &PyDict_Type, &twins,
                          &PyDict_Type, &docs))
        return NULL;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Engine, "ranks", &D.e_ranks}, {Engine, "events", &D.e_events}, {Engine, "blocked", &D.e_blocked},
        {Engine, "finished", &D.e_finished}, {Engine, "world_size", &D.e_world_size},
        {Engine, "coroutines", &D.e_coroutines}, {Engine, "ready", &D.e_ready}, {Engine, "driving", &D.e_driving},
        {Engine, "throw_into", &D.e_throw_into}, {Engine, "stepping", &D.e_stepping}, {Engine, "thread", &D.e_thread},
        {Engine, "transfers", &D.e_transfers}, {Engine, "instant_transfers", &D.e_instant},
        {Work, "engine", &D.w_engine}, {Work, "rank", &D.w_rank}, {Work, "end", &D.w_end},
        {Work, "future", &D.w_future}, {RankState, "waiting", &D.s_waiting}, {EventLog, "recent", &D.l_recent},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return NULL;
    PyTypeObject **types[] = {&D.Engine, &D.RankState, &D.Work, &D.EventLog};
    PyObject *given[] = {Engine, RankState, Work, EventLog};
    for (int i = 0; i < 4; i++) Py_XSETREF(*types[i], (PyTypeObject *)Py_NewRef(given[i]));
    Py_XSETREF(D.wake_me, Py_NewRef(wake_me));
    D.pack_at = pack_at;
    if (replace_method(Engine, &wake_def, &D.py_wake, docs) < 0 ||
        replace_method(Engine, &drive_def, &D.py_drive, docs) < 0 ||
        replace_method(Engine, &schedule_def, &D.py_schedule, docs) < 0 ||
        replace_method(Work, &await_def, &D.py_await, docs) < 0)
        return NULL;
    /* the Python methods, for tests that run both */
    if (PyDict_SetItemString(twins, "Engine.wake", D.py_wake) < 0 ||
        PyDict_SetItemString(twins, "Engine._drive", D.py_drive) < 0 ||
        PyDict_SetItemString(twins, "Engine.schedule", D.py_schedule) < 0 ||
        PyDict_SetItemString(twins, "Work.__await__", D.py_await) < 0)
        return NULL;
    Py_RETURN_NONE;
}

