/* The twin `comm`: the C collective path, in four parts, each the twin of its Python: a member's issue
 * (`Model.all_reduce`, `all_gather`, `reduce_scatter`), the resolution of a collective every member issued
 * (`comm._resolve_ready`), its start and end on the group's stream (`comm._start`, `comm._finish`) and
 * awaiting it (`Work._complete`). `install_comm_ops` puts all four in place. */
#include "_common.h"

/* `comm._start(engine, coll)` (C, or the Python for an unusual collective): None, or NULL with an exception. */
static PyObject *comm_start(PyObject *engine, PyObject *coll);
/* `comm._resolve_ready(engine, coll)` (C, or the Python for an unusual collective and every error): None,
 * or NULL with an exception. */
static PyObject *comm_resolve_ready(PyObject *engine, PyObject *coll);

/* ==== a collective's start and end: comm._start, comm._finish ===================================== */

/* C twins of the start and the end of a collective on its group's stream: `comm._start` and `comm._finish`
 * (with `comm.release`), as `_p2p.c` has them for messages.
 *
 * The common case is handled exactly as the Python does it: the same group books, the same events in the same
 * order, the same wake-ups, and the same frees at the same clocks (a Work the strategy dropped goes when the
 * stream releases it, with its rank's clock moved to the end meanwhile; the objects the Python's frame still
 * holds when it returns, the first member's input and the last member's Work and result, go after the next
 * queued collective started, at the rank's own clock). Anything else (a collective whose books are not the
 * Python classes' or not complete, a start that is not a float) goes to the Python, which stays the
 * specification; nothing is changed before the fast path is sure to finish. Transfers are made and scheduled
 * through their Python-visible names (`comm.Transfer`, `Engine.schedule`), whichever implementation those have.
 */

static struct {
    PyTypeObject *Group, *Collective, *Work, *RankState, *Tensor;
    PyObject *py_finish, *py_start; /* the Python twins */
    PyObject *Transfer, *finish;    /* comm.Transfer and the C finish */
    /* Group */
    Py_ssize_t g_ranks, g_free, g_busy, g_ready, g_usage;
    /* Collective */
    Py_ssize_t c_group, c_seq, c_op, c_works, c_first, c_results, c_nbytes, c_label, c_duration;
    /* Work */
    Py_ssize_t w_rank, w_op, w_issue, w_end, w_result, w_input, w_future;
    /* RankState */
    Py_ssize_t s_clock, s_comm_end;
    /* Tensor */
    Py_ssize_t t_layer;
    PyObject *s_collective, *s_send, *s_schedule, *s_wake, *s_owner, *s_start, *s_end, *s_next_op_id, *s_ranks,
        *s_events, *s_recent, *s_maybe_pack, *s_samples, *zero, *zero_float;
} E;

/* ---- the start ----------------------------------------------------------------------------------- */

/* Are coll's books those of a complete Collective of the Python classes (group, works of its size)? */
static int complete_books(PyObject *coll) {
    if (Py_TYPE(coll) != E.Collective) return 0;
    PyObject *group = SLOT(coll, E.c_group), *works = SLOT(coll, E.c_works);
    if (!group || Py_TYPE(group) != E.Group || !works || !PyList_CheckExact(works)) return 0;
    PyObject *ranks = SLOT(group, E.g_ranks);
    if (!ranks || !PyTuple_CheckExact(ranks) || PyTuple_GET_SIZE(ranks) != PyList_GET_SIZE(works) ||
        PyList_GET_SIZE(works) == 0)
        return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(works); i++)
        if (Py_TYPE(PyList_GET_ITEM(works, i)) != E.Work) return 0;
    return 1;
}

/* `comm._start(engine, coll)`: the group's stream takes `coll`, which starts once the last member issued it
 * and the stream is free. */
static PyObject *start_collective(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !complete_books(args[1])) goto slow;
    PyObject *engine = args[0], *coll = args[1];
    PyObject *group = SLOT(coll, E.c_group), *works = SLOT(coll, E.c_works);
    PyObject *free = SLOT(group, E.g_free), *seq = SLOT(coll, E.c_seq), *duration = SLOT(coll, E.c_duration);
    PyObject *usage = SLOT(group, E.g_usage);
    if (!free || !PyFloat_CheckExact(free) || !seq || !duration || !usage) goto slow;
    /* max(max(w.issue for w in works), group.free): the first of the largest */
    PyObject *at = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(works); i++) {
        PyObject *issue = SLOT(PyList_GET_ITEM(works, i), E.w_issue);
        if (!issue || !PyFloat_CheckExact(issue)) goto slow;
        if (!at || PyFloat_AS_DOUBLE(issue) > PyFloat_AS_DOUBLE(at)) at = issue;
    }
    if (PyFloat_AS_DOUBLE(free) > PyFloat_AS_DOUBLE(at)) at = free;
    Py_INCREF(at);
    Py_SETREF(SLOT(group, E.g_busy), Py_NewRef(Py_True));
    PyObject *transfer = NULL, *done = NULL, *key = PyTuple_Pack(3, E.zero, SLOT(group, E.g_ranks), seq);
    if (key) {
        PyObject *call[6] = {at, duration, usage, E.finish, coll, key};
        transfer = PyObject_Vectorcall(E.Transfer, call, 6, NULL);
    }
    if (transfer) {
        PyObject *call[2] = {engine, transfer};
        done = PyObject_VectorcallMethod(E.s_schedule, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_DECREF(at);
    Py_XDECREF(key);
    Py_XDECREF(transfer);
    return done;
slow:
    return PyObject_Vectorcall(E.py_start, args, nargs, NULL);
}

static PyObject *comm_start(PyObject *engine, PyObject *coll) {
    PyObject *args[2] = {engine, coll};
    return start_collective(NULL, args, 2);
}

/* ---- the end ------------------------------------------------------------------------------------- */

/* The RankState of `rank` in the list `ranks` (borrowed), or NULL with an exception. */
static PyObject *rank_state(PyObject *ranks, PyObject *rank) {
    Py_ssize_t r = rank ? PyNumber_AsSsize_t(rank, NULL) : -1;
    if (r < 0 || r >= PyList_GET_SIZE(ranks)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "a collective's rank is not in engine.ranks");
        return NULL;
    }
    PyObject *state = PyList_GET_ITEM(ranks, r);
    if (Py_TYPE(state) != E.RankState || !SLOT(state, E.s_clock) || !SLOT(state, E.s_comm_end)) {
        PyErr_SetString(PyExc_TypeError, "engine.ranks holds RankStates with clocks");
        return NULL;
    }
    return state;
}

/* `comm._finish(engine, transfer)`: the collective ended (its end is final). */
static PyObject *finish(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) goto slow;
    PyObject *engine = args[0], *transfer = args[1];
    PyObject *coll = PyObject_GetAttr(transfer, E.s_owner);
    if (!coll) return NULL;
    PyObject *results = NULL, *first = NULL;
    int fast = complete_books(coll);
    if (fast) {
        results = SLOT(coll, E.c_results);
        PyObject *works = SLOT(coll, E.c_works);
        first = SLOT(PyList_GET_ITEM(works, 0), E.w_input);
        fast = results && PyList_CheckExact(results) && PyList_GET_SIZE(results) == PyList_GET_SIZE(works) &&
               first && PyObject_TypeCheck(first, E.Tensor) && SLOT(first, E.t_layer) && SLOT(coll, E.c_op) &&
               SLOT(coll, E.c_nbytes) && SLOT(coll, E.c_label) && SLOT(SLOT(coll, E.c_group), E.g_ready) &&
               PyList_CheckExact(SLOT(SLOT(coll, E.c_group), E.g_ready));
    }
    if (!fast) {
        Py_DECREF(coll);
        goto slow;
    }
    PyObject *group = Py_NewRef(SLOT(coll, E.c_group)), *works = Py_NewRef(SLOT(coll, E.c_works));
    Py_INCREF(results);
    Py_INCREF(first); /* the Python frame's `first`, `work` and `result` live until it returns */
    Py_ssize_t n = PyList_GET_SIZE(works);
    PyObject *last_work = Py_NewRef(PyList_GET_ITEM(works, n - 1)), *last_result = NULL;
    PyObject *start = NULL, *end = NULL, *next_id = NULL, *ranks = NULL, *log = NULL, *recent = NULL,
             *samples = NULL, *samples_of = NULL, *ret = NULL;
    double start_s, end_s;
    if (transfer_times(transfer, &start_s, &end_s)) {
        if (!(start = PyFloat_FromDouble(start_s)) || !(end = PyFloat_FromDouble(end_s))) goto done;
    } else if (!(start = PyObject_GetAttr(transfer, E.s_start)) || !(end = PyObject_GetAttr(transfer, E.s_end))) {
        goto done;
    }
    if (!(ranks = slot_get(engine, E.s_ranks)) || !(log = slot_get(engine, E.s_events)) ||
        !(recent = slot_get(log, E.s_recent)))
        goto done;
    if (!PyList_CheckExact(ranks) || !PyList_CheckExact(recent)) {
        PyErr_SetString(PyExc_TypeError, "engine.ranks and engine.events.recent must be lists");
        goto done;
    }
    if (!(next_id = take_op_id(engine, E.s_next_op_id))) goto done;
    Py_SETREF(SLOT(group, E.g_free), Py_NewRef(end));
    Py_SETREF(SLOT(group, E.g_busy), Py_NewRef(Py_False));
    PyObject *op = SLOT(coll, E.c_op), *layer = SLOT(first, E.t_layer), *nbytes = SLOT(coll, E.c_nbytes);
    PyObject *label = SLOT(coll, E.c_label), *peers = SLOT(group, E.g_ranks);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *work = PyList_GET_ITEM(works, i), *result = PyList_GET_ITEM(results, i);
        PyObject *rank = SLOT(work, E.w_rank), *state = rank_state(ranks, rank);
        if (!state) goto done;
        int later = PyObject_RichCompareBool(end, SLOT(state, E.s_comm_end), Py_GT);
        if (later < 0) goto done;
        if (later) Py_SETREF(SLOT(state, E.s_comm_end), Py_NewRef(end));
        Py_XSETREF(SLOT(work, E.w_end), Py_NewRef(end));
        Py_XSETREF(SLOT(work, E.w_result), Py_NewRef(result));
        if (result != samples_of) { /* an all-reduce's members share one result */
            Py_XSETREF(samples, PyObject_GetAttr(result, E.s_samples));
            if (!samples) goto done;
            samples_of = result;
        }
        PyObject *items[12] = {rank, op, E.s_collective, start, end, layer, samples, nbytes, E.zero_float, peers,
                               next_id, label};
        if (append_event(recent, items) < 0) goto done;
        if (SLOT(work, E.w_future) != Py_None) { /* its rank waits on it */
            PyObject *r = engine_wake(engine, work);
            if (!r) goto done;
            Py_DECREF(r);
        }
    }
    last_result = Py_NewRef(PyList_GET_ITEM(results, n - 1));
    {
        PyObject *r = PyObject_CallMethodNoArgs(log, E.s_maybe_pack);
        if (!r) goto done;
        Py_DECREF(r);
    }
    /* resolved: no Work <-> Collective cycle may outlive the step */
    PyObject *fresh_works = PyList_New(0), *fresh_results = fresh_works ? PyList_New(0) : NULL;
    if (!fresh_results) {
        Py_XDECREF(fresh_works);
        goto done;
    }
    Py_XSETREF(SLOT(coll, E.c_works), fresh_works);
    Py_XSETREF(SLOT(coll, E.c_first), Py_NewRef(Py_None));
    Py_XSETREF(SLOT(coll, E.c_results), fresh_results);
    Py_CLEAR(results);
    /* `comm.release(engine, works, end)`: the stream lets go of each Work, last first, at `end` (or its rank's
     * clock, if that is later) */
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *work = Py_NewRef(PyList_GET_ITEM(works, i));
        if (PyList_SetSlice(works, i, i + 1, NULL) < 0) {
            Py_DECREF(work);
            goto done;
        }
        PyObject *state = rank_state(ranks, SLOT(work, E.w_rank));
        if (!state) {
            Py_DECREF(work);
            goto done;
        }
        PyObject *clock = Py_NewRef(SLOT(state, E.s_clock));
        int later = PyObject_RichCompareBool(end, clock, Py_GT);
        if (later < 0) {
            Py_DECREF(clock);
            Py_DECREF(work);
            goto done;
        }
        if (later) Py_SETREF(SLOT(state, E.s_clock), Py_NewRef(end));
        PyObject *what = SLOT(work, E.w_op);
        if (what && PyUnicode_Check(what) && PyUnicode_Compare(what, E.s_send) == 0)
            Py_XSETREF(SLOT(work, E.w_input), Py_NewRef(Py_None));
        Py_DECREF(work);
        Py_XSETREF(SLOT(state, E.s_clock), clock); /* takes our reference */
    }
    PyObject *ready = SLOT(group, E.g_ready);
    if (PyList_CheckExact(ready) && PyList_GET_SIZE(ready)) { /* group.ready.pop(0) */
        PyObject *next = Py_NewRef(PyList_GET_ITEM(ready, 0));
        if (PyList_SetSlice(ready, 0, 1, NULL) < 0) {
            Py_DECREF(next);
            goto done;
        }
        PyObject *r = comm_start(engine, next);
        Py_DECREF(next);
        if (!r) goto done;
        Py_DECREF(r);
    }
    ret = Py_NewRef(Py_None);
done:
    Py_DECREF(coll);
    Py_DECREF(group);
    Py_DECREF(works);
    Py_XDECREF(results);
    Py_XDECREF(start);
    Py_XDECREF(end);
    Py_XDECREF(next_id);
    Py_XDECREF(ranks);
    Py_XDECREF(log);
    Py_XDECREF(recent);
    Py_XDECREF(samples);
    /* in the order the Python frame lets go of them */
    Py_DECREF(first);
    Py_DECREF(last_work);
    Py_XDECREF(last_result);
    return ret;
slow:
    return PyObject_Vectorcall(E.py_finish, args, nargs, NULL);
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef start_def = {"_start", (PyCFunction)(void (*)(void))start_collective, METH_FASTCALL,
                                "_start(engine, coll)\n--\n\nThe group's stream takes `coll`: the C twin of "
                                "comm._start."};
static PyMethodDef finish_def = {"_finish", (PyCFunction)(void (*)(void))finish, METH_FASTCALL,
                                 "_finish(engine, transfer)\n--\n\nThe collective ended (its end is final): the C "
                                 "twin of comm._finish."};

static int get_class(PyObject *module, const char *name, PyTypeObject **out) {
    PyObject *value = PyObject_GetAttrString(module, name);
    if (!value) return -1;
    if (!PyType_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%R.%s is not a class", module, name);
        Py_DECREF(value);
        return -1;
    }
    Py_XSETREF(*out, (PyTypeObject *)value);
    return 0;
}

static int install_comm_end(PyObject *comm, PyObject *RankState) {
    if (!E.s_collective) {
        struct { PyObject **out; const char *text; } strings[] = {
            {&E.s_collective, "collective"}, {&E.s_send, "send"}, {&E.s_schedule, "schedule"}, {&E.s_wake, "wake"},
            {&E.s_owner, "owner"}, {&E.s_start, "start"}, {&E.s_end, "end"}, {&E.s_next_op_id, "next_op_id"},
            {&E.s_ranks, "ranks"}, {&E.s_events, "events"}, {&E.s_recent, "recent"},
            {&E.s_maybe_pack, "maybe_pack"}, {&E.s_samples, "samples"},
        };
        for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
            if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
        if (!(E.zero = PyLong_FromLong(0)) || !(E.zero_float = PyFloat_FromDouble(0.0))) return -1;
    }
    PyObject *twins = PyObject_GetAttrString(comm, "PYTHON_TWINS");
    if (!twins) return -1;
    PyObject *py_finish = PyDict_Check(twins) ? PyDict_GetItemString(twins, "_finish") : NULL;
    PyObject *py_start = PyDict_Check(twins) ? PyDict_GetItemString(twins, "_start") : NULL;
    if (!py_finish || !py_start || !PyFunction_Check(py_finish) || !PyFunction_Check(py_start)) {
        Py_DECREF(twins);
        PyErr_SetString(PyExc_TypeError, "comm.PYTHON_TWINS must name the Python _finish and _start");
        return -1;
    }
    Py_XSETREF(E.py_finish, Py_NewRef(py_finish));
    Py_XSETREF(E.py_start, Py_NewRef(py_start));
    Py_DECREF(twins);
    if (get_class(comm, "Group", &E.Group) < 0 || get_class(comm, "Collective", &E.Collective) < 0 ||
        get_class(comm, "Work", &E.Work) < 0 || get_class(comm, "Tensor", &E.Tensor) < 0)
        return -1;
    PyObject *transfer = PyObject_GetAttrString(comm, "Transfer");
    if (!transfer) return -1;
    Py_XSETREF(E.Transfer, transfer);
    Py_XSETREF(E.RankState, (PyTypeObject *)Py_NewRef(RankState));
    PyObject *Group = (PyObject *)E.Group, *Collective = (PyObject *)E.Collective, *Work = (PyObject *)E.Work;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Group, "ranks", &E.g_ranks}, {Group, "free", &E.g_free}, {Group, "busy", &E.g_busy},
        {Group, "ready", &E.g_ready}, {Group, "usage", &E.g_usage},
        {Collective, "group", &E.c_group}, {Collective, "seq", &E.c_seq}, {Collective, "op", &E.c_op},
        {Collective, "works", &E.c_works}, {Collective, "first", &E.c_first}, {Collective, "results", &E.c_results},
        {Collective, "nbytes", &E.c_nbytes}, {Collective, "label", &E.c_label},
        {Collective, "duration", &E.c_duration},
        {Work, "rank", &E.w_rank}, {Work, "op", &E.w_op}, {Work, "issue", &E.w_issue}, {Work, "end", &E.w_end},
        {Work, "result", &E.w_result}, {Work, "input", &E.w_input}, {Work, "future", &E.w_future},
        {RankState, "clock", &E.s_clock}, {RankState, "comm_end", &E.s_comm_end},
        {(PyObject *)E.Tensor, "layer", &E.t_layer},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return -1;
    PyObject *c_start = PyCFunction_New(&start_def, NULL);
    if (!c_start) return -1;
    if (!E.finish && !(E.finish = PyCFunction_New(&finish_def, NULL))) {
        Py_DECREF(c_start);
        return -1;
    }
    int failed = PyObject_SetAttrString(comm, "_start", c_start) < 0 ||
                 PyObject_SetAttrString(comm, "_finish", E.finish) < 0;
    Py_DECREF(c_start);
    return failed ? -1 : 0;
}

/* ==== awaiting a finished Work: Work._complete ==================================================== */

/* C twin of `comm.Work._complete`: what awaiting a finished Work does on its rank (every awaited collective
 * and message ends here). The rank's clock moves to the op's end; an all-reduce's result (`collective_rules.Reduced`) is
 * made a view of the member's own input with the reduced samples or parts, a received tensor
 * (`comm._Pending`) is allocated on the receiver; the Work lets go of its input.
 *
 * Done exactly as the Python does it, in the same order (the clock first, so that a received tensor's
 * allocation is logged at the end of its message); anything else (a result of another kind, an all-reduce of
 * a tensor class the Python makes otherwise, books that are not the Python classes') goes to the Python method,
 * which stays the specification.
 */

static struct {
    PyTypeObject *Work, *Reduced, *Pending, *RankState, *WeightGrad, *Activation, *ActivationGrad;
    PyObject *py_complete; /* the Python twin */
    /* Work */
    Py_ssize_t w_engine, w_rank, w_end, w_result, w_input;
    /* RankState */
    Py_ssize_t s_rank, s_clock, s_memory;
    /* MemoryTracker */
    Py_ssize_t mem_context;
    /* collective_rules.Reduced and comm._Pending */
    Py_ssize_t r_samples, r_tp_parts, r_tp_size, p_cls, p_values, p_nbytes, p_layer;
    /* WeightGrad; Activation and ActivationGrad */
    Py_ssize_t t_rank, t_layer, t_samples, t_shards, t_num_shards, t_tp_rank, t_tp_size;
    PyObject *s_ranks, *s_recv;
} W;

/* `Reduced.materialize(t)`: t's class, a view of t, with the reduced samples (a gradient) or parts. NULL
 * without an exception for a class the Python makes otherwise. */
static PyObject *reduced_view(PyObject *reduced, PyObject *t) {
    PyTypeObject *type = Py_TYPE(t);
    if (type == W.WeightGrad) {
        PyObject *fields[7] = {SLOT(t, W.t_rank), SLOT(t, W.t_layer), SLOT(reduced, W.r_samples), SLOT(t, W.t_shards),
                               SLOT(t, W.t_num_shards), SLOT(t, W.t_tp_rank), SLOT(t, W.t_tp_size)};
        for (int i = 0; i < 7; i++)
            if (!fields[i]) return NULL;
        return buffer_view(type, t, fields, 7);
    }
    if (type == W.Activation || type == W.ActivationGrad) {
        PyObject *fields[5] = {SLOT(t, W.t_rank), SLOT(t, W.t_layer), SLOT(t, W.t_samples),
                               SLOT(reduced, W.r_tp_parts), SLOT(reduced, W.r_tp_size)};
        for (int i = 0; i < 5; i++)
            if (!fields[i]) return NULL;
        return buffer_view(type, t, fields, 5);
    }
    return NULL;
}

/* `_Pending.materialize(state)`: cls(state.memory, nbytes, state.rank, *values), named for an out-of-memory
 * error. NULL without an exception if the books are not the Python classes'. */
static PyObject *received(PyObject *pending, PyObject *state) {
    PyObject *cls = SLOT(pending, W.p_cls), *values = SLOT(pending, W.p_values), *nbytes = SLOT(pending, W.p_nbytes);
    PyObject *layer = SLOT(pending, W.p_layer), *mem = SLOT(state, W.s_memory), *rank = SLOT(state, W.s_rank);
    if (!cls || !values || !PyTuple_CheckExact(values) || PyTuple_GET_SIZE(values) > 12 || !nbytes || !layer ||
        !mem || !rank)
        return NULL;
    PyObject *context = PyTuple_Pack(2, W.s_recv, layer);
    if (!context) return NULL;
    Py_XSETREF(SLOT(mem, W.mem_context), context); /* what an out-of-memory error names */
    PyObject *args[15] = {mem, nbytes, rank};
    Py_ssize_t n = PyTuple_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < n; i++) args[3 + i] = PyTuple_GET_ITEM(values, i);
    return PyObject_Vectorcall(cls, args, 3 + n, NULL);
}

static PyObject *complete(PyObject *self, PyObject *unused) {
    if (Py_TYPE(self) != W.Work) goto slow;
    PyObject *engine = SLOT(self, W.w_engine), *end = SLOT(self, W.w_end), *result = SLOT(self, W.w_result);
    PyObject *input = SLOT(self, W.w_input);
    Py_ssize_t rank = SLOT(self, W.w_rank) ? PyNumber_AsSsize_t(SLOT(self, W.w_rank), NULL) : -1;
    if (!engine || !end || !result || !input || rank < 0) {
        PyErr_Clear();
        goto slow;
    }
    PyTypeObject *kind = Py_TYPE(result);
    if (kind == W.Reduced && Py_TYPE(input) != W.WeightGrad && Py_TYPE(input) != W.Activation &&
        Py_TYPE(input) != W.ActivationGrad)
        goto slow;
    PyObject *ranks = PyObject_GetAttr(engine, W.s_ranks);
    if (!ranks) return NULL;
    if (!PyList_CheckExact(ranks) || rank >= PyList_GET_SIZE(ranks) ||
        Py_TYPE(PyList_GET_ITEM(ranks, rank)) != W.RankState || !SLOT(PyList_GET_ITEM(ranks, rank), W.s_clock)) {
        Py_DECREF(ranks);
        goto slow;
    }
    PyObject *state = Py_NewRef(PyList_GET_ITEM(ranks, rank));
    Py_DECREF(ranks);
    int later = PyObject_RichCompareBool(SLOT(state, W.s_clock), end, Py_LT);
    if (later < 0) {
        Py_DECREF(state);
        return NULL;
    }
    if (later) Py_SETREF(SLOT(state, W.s_clock), Py_NewRef(end));
    if (kind == W.Reduced || kind == W.Pending) { /* made on this member now */
        PyObject *made = kind == W.Reduced ? reduced_view(result, input) : received(result, state);
        if (!made) {
            Py_DECREF(state);
            if (PyErr_Occurred()) return NULL;
            /* (the clock moved already, as the Python moves it before it makes the result) */
            PyObject *args[1] = {self};
            return PyObject_Vectorcall(W.py_complete, args, 1, NULL);
        }
        Py_SETREF(SLOT(self, W.w_result), made);
        result = made;
    }
    Py_DECREF(state);
    Py_INCREF(result);
    Py_SETREF(SLOT(self, W.w_input), Py_NewRef(Py_None));
    return result;
slow:;
    PyObject *args[1] = {self};
    return PyObject_Vectorcall(W.py_complete, args, 1, NULL);
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef complete_def = {"_complete", (PyCFunction)complete, METH_NOARGS,
                                   "_complete($self)\n--\n\nThe op ended and its rank awaits it: move the rank's "
                                   "clock to the end and return the result (the C twin of Work._complete)."};

static int install_work(PyObject *comm, PyObject *RankState, PyObject *MemoryTracker) {
    if (!W.s_ranks && (!(W.s_ranks = PyUnicode_InternFromString("ranks")) ||
                       !(W.s_recv = PyUnicode_InternFromString("recv"))))
        return -1;
    const ClassRef classes[] = {
        {"Work", &W.Work}, {"Reduced", &W.Reduced}, {"_Pending", &W.Pending}, {"WeightGrad", &W.WeightGrad},
        {"Activation", &W.Activation}, {"ActivationGrad", &W.ActivationGrad},
    };
    if (load_classes(comm, "comm", classes, sizeof classes / sizeof classes[0]) < 0) return -1;
    Py_XSETREF(W.RankState, (PyTypeObject *)Py_NewRef(RankState));
    PyObject *Work = (PyObject *)W.Work, *Reduced = (PyObject *)W.Reduced, *Pending = (PyObject *)W.Pending;
    PyObject *WeightGrad = (PyObject *)W.WeightGrad;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Work, "engine", &W.w_engine}, {Work, "rank", &W.w_rank}, {Work, "end", &W.w_end},
        {Work, "result", &W.w_result}, {Work, "input", &W.w_input},
        {RankState, "rank", &W.s_rank}, {RankState, "clock", &W.s_clock}, {RankState, "memory", &W.s_memory},
        {MemoryTracker, "context", &W.mem_context},
        {Reduced, "samples", &W.r_samples}, {Reduced, "tp_parts", &W.r_tp_parts}, {Reduced, "tp_size", &W.r_tp_size},
        {Pending, "cls", &W.p_cls}, {Pending, "values", &W.p_values}, {Pending, "nbytes", &W.p_nbytes},
        {Pending, "layer", &W.p_layer},
        {WeightGrad, "rank", &W.t_rank}, {WeightGrad, "layer", &W.t_layer}, {WeightGrad, "samples", &W.t_samples},
        {WeightGrad, "shards", &W.t_shards}, {WeightGrad, "num_shards", &W.t_num_shards},
        {WeightGrad, "tp_rank", &W.t_tp_rank}, {WeightGrad, "tp_size", &W.t_tp_size},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return -1;
    /* Activation and ActivationGrad have rank, layer and samples where WeightGrad has them (the Tensor base) */
    const char *shared[] = {"rank", "layer", "samples"};
    Py_ssize_t want[] = {W.t_rank, W.t_layer, W.t_samples};
    PyObject *hidden[] = {(PyObject *)W.Activation, (PyObject *)W.ActivationGrad};
    if (same_layout(hidden, 2, shared, want, 3) < 0) return -1;
    PyObject *docs = PyDict_New(); /* (the docstring is the C one's) */
    if (!docs) return -1;
    int failed = replace_method(Work, &complete_def, &W.py_complete, docs);
    Py_DECREF(docs);
    if (failed) return -1;
    PyObject *twins = PyObject_GetAttrString(comm, "PYTHON_TWINS"); /* for tests that run both */
    failed = !twins || !PyDict_Check(twins) || PyDict_SetItemString(twins, "Work._complete", W.py_complete) < 0;
    if (failed && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "comm.PYTHON_TWINS must be a dict");
    Py_XDECREF(twins);
    return failed ? -1 : 0;
}

/* ==== a collective every member issued: comm._resolve_ready ======================================= */

/* C twin of `comm._resolve_ready` with `collective_rules.combine` for the collectives a training step issues most: the
 * all-reduce of TP partial sums of an activation or its gradient (Megatron-LM's f and g operators, Shoeybi
 * et al. 2019, sec. 3), the all-gather of TP pieces of one (Narayanan et al. 2021, sec. 4.1) and the
 * all-reduce of whole-layer gradients of disjoint samples (data parallelism).
 *
 * Every member has issued the collective: its inputs are checked and combined into the members' results,
 * it is priced from the group's cost cache and started on the group's stream, or queued behind the
 * collective in flight there, exactly as the Python does it. Everything else goes to the Python, which stays
 * the specification: other ops and tensor kinds, inputs that do not combine (every error is raised there, with
 * its message), a cost the group has not computed yet. Nothing is changed before the fast path is sure to
 * finish, so the Python starts from the same state.
 */

static struct {
    PyTypeObject *Group, *Collective, *Work, *Reduced, *WeightGrad, *Activation, *ActivationGrad, *ActivationSlice,
        *ActivationGradSlice;
    PyObject *py_resolve_ready; /* the Python twin */
    PyObject *all_reduce, *all_gather;
    /* Group */
    Py_ssize_t g_pending, g_costs, g_busy, g_ready;
    /* Collective */
    Py_ssize_t c_group, c_seq, c_op, c_works, c_results, c_nbytes, c_label, c_duration;
    /* Work */
    Py_ssize_t w_input, w_result;
    /* WeightGrad */
    Py_ssize_t t_samples, t_shards, t_num_shards, t_tp_rank, t_tp_size;
    /* Activation, ActivationGrad and their slices */
    Py_ssize_t h_samples, h_layer, h_tp_parts, h_tp_size;
    /* collective_rules.Reduced */
    Py_ssize_t r_samples, r_tp_parts, r_tp_size;
    PyObject *s_kind, *s_workload, *s_num_layers, *s_moe, *s_partial_sums, *s_gather, *one;
} R;

/* The union of the members' masks at `offset` if no two overlap (a new reference); NULL without an exception
 * if two do (the Python names them); NULL with one on failure. */
static PyObject *disjoint_union(PyObject *works, Py_ssize_t offset) {
    Py_ssize_t n = PyList_GET_SIZE(works);
#ifdef MASK_DIGITS
    /* two or more non-negative ints, one of three digits or more: their bits gathered in one buffer of digits (each
       member's mask is looked at once, rather than each step making an int as wide as the union so far) */
    Py_ssize_t width = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *mask = SLOT(SLOT(PyList_GET_ITEM(works, i), R.w_input), offset);
        Py_ssize_t digits = PyLong_CheckExact(mask) ? MASK_NDIGITS(mask) : -1;
        if (digits < 0) { width = -1; break; }
        if (digits > width) width = digits;
    }
    if (width >= 3 && n > 1) {
        digit *all = PyMem_Calloc((size_t)width, sizeof(digit));
        if (!all) return PyErr_NoMemory();
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *mask = SLOT(SLOT(PyList_GET_ITEM(works, i), R.w_input), offset);
            const digit *d = MASK_DIGITS(mask);
            for (Py_ssize_t k = 0, digits = MASK_NDIGITS(mask); k < digits; k++) {
                if (all[k] & d[k]) { /* two members share samples: the Python twin says which */
                    PyMem_Free(all);
                    return NULL;
                }
                all[k] |= d[k];
            }
        }
        /* the widest member's top digit is not zero: the union is normalized as it stands */
        PyLongObject *out = _PyLong_New(width);
        if (out) memcpy(MASK_DIGITS(out), all, (size_t)width * sizeof(digit));
        PyMem_Free(all);
        return (PyObject *)out;
    }
#endif
    PyObject *all = Py_NewRef(SLOT(SLOT(PyList_GET_ITEM(works, 0), R.w_input), offset));
    for (Py_ssize_t i = 1; i < n; i++) {
        PyObject *mask = SLOT(SLOT(PyList_GET_ITEM(works, i), R.w_input), offset);
        PyObject *common = PyNumber_And(all, mask);
        if (!common) goto fail;
        int overlap = PyObject_IsTrue(common);
        Py_DECREF(common);
        if (overlap) goto fail; /* (-1: an error, kept) */
        Py_SETREF(all, PyNumber_Or(all, mask));
        if (!all) return NULL;
    }
    return all;
fail:
    Py_DECREF(all);
    return NULL;
}

/* Do all members' inputs have field `offset` equal to the first's? 1, 0, or -1 with an exception. */
static int all_equal(PyObject *works, Py_ssize_t offset) {
    PyObject *want = SLOT(SLOT(PyList_GET_ITEM(works, 0), R.w_input), offset);
    for (Py_ssize_t i = 1; i < PyList_GET_SIZE(works); i++) {
        int same = int_eq(SLOT(SLOT(PyList_GET_ITEM(works, i), R.w_input), offset), want);
        if (same != 1) return same;
    }
    return 1;
}

/* One `collective_rules.Reduced` all members share: the reduced samples and, for TP partial sums, the parts. */
static PyObject *new_reduced(PyObject *samples, PyObject *tp_parts, PyObject *tp_size) {
    PyObject *reduced = R.Reduced->tp_alloc(R.Reduced, 0);
    if (!reduced) return NULL;
    SLOT(reduced, R.r_samples) = Py_NewRef(samples);
    SLOT(reduced, R.r_tp_parts) = Py_NewRef(tp_parts);
    SLOT(reduced, R.r_tp_size) = Py_NewRef(tp_size);
    return reduced;
}

/* [item] * n */
static PyObject *repeated(PyObject *item, Py_ssize_t n) {
    PyObject *list = item ? PyList_New(n) : NULL;
    for (Py_ssize_t i = 0; list && i < n; i++) PyList_SET_ITEM(list, i, Py_NewRef(item));
    return list;
}

/* `collective_rules.combine` for the common collectives: the members' results, the bytes the cost is based on, the
 * label and whether it is a layer's pair of TP all-reduces, 1 a forward's and 2 a backward's (the cost key's
 * last field). 1 when done, 0 when the Python must do it, -1 with an exception. */
static int combine(PyObject *engine, PyObject *coll, PyObject **results, PyObject **nbytes, PyObject **label,
                   int *pair) {
    PyObject *works = SLOT(coll, R.c_works), *op = SLOT(coll, R.c_op);
    Py_ssize_t n = PyList_GET_SIZE(works);
    PyObject *first = SLOT(PyList_GET_ITEM(works, 0), R.w_input);
    PyTypeObject *type = Py_TYPE(first);
    for (Py_ssize_t i = 1; i < n; i++)
        if (Py_TYPE(SLOT(PyList_GET_ITEM(works, i), R.w_input)) != type) return 0;
    PyObject *kind = NULL, *all = NULL;
    *pair = 0;
    if (op == R.all_reduce && type == R.WeightGrad) { /* gradients of disjoint samples */
        int same = all_equal(works, R.t_tp_rank);
        if (same == 1) same = all_equal(works, R.t_tp_size);
        if (same == 1) same = all_equal(works, R.t_shards);
        if (same == 1) same = all_equal(works, R.t_num_shards);
        if (same != 1) return same;
        if (!(all = disjoint_union(works, R.t_samples))) return PyErr_Occurred() ? -1 : 0;
        PyObject *reduced = new_reduced(all, R.one, R.one);
        Py_DECREF(all);
        *label = PyObject_GetAttr(first, R.s_kind);
        *results = *label ? repeated(reduced, n) : NULL;
        Py_XDECREF(reduced);
    } else if (op == R.all_reduce && (type == R.Activation || type == R.ActivationGrad)) { /* TP partial sums */
        long tp_size = small_int(SLOT(first, R.h_tp_size), -1);
        int same = all_equal(works, R.h_samples);
        if (same == 1) same = all_equal(works, R.h_tp_size); /* (else Python names the mismatch) */
        if (same != 1) return same;
        if (tp_size < 1 || tp_size > 62) return 0;
        long parts = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            long mine = small_int(SLOT(SLOT(PyList_GET_ITEM(works, i), R.w_input), R.h_tp_parts), -1);
            if (mine < 0 || parts & mine) return 0;
            parts |= mine;
        }
        PyObject *reduced;
        if (parts == (1L << tp_size) - 1) { /* complete: 1 part of 1 */
            reduced = new_reduced(SLOT(first, R.h_samples), R.one, R.one);
        } else {
            PyObject *union_ = PyLong_FromLong(parts);
            reduced = union_ ? new_reduced(SLOT(first, R.h_samples), union_, SLOT(first, R.h_tp_size)) : NULL;
            Py_XDECREF(union_);
        }
        if (type == R.Activation) {
            *pair = 1;
        } else { /* the LM head's input gradient is one all-reduce, a layer's two (an MoE layer's: Python) */
            PyObject *workload = PyObject_GetAttr(engine, R.s_workload);
            PyObject *moe = workload ? PyObject_GetAttr(workload, R.s_moe) : NULL;
            if (!moe || moe != Py_None) {
                Py_XDECREF(moe);
                Py_XDECREF(workload);
                Py_XDECREF(reduced);
                return PyErr_Occurred() ? -1 : 0;
            }
            Py_DECREF(moe);
            PyObject *layers = workload ? PyObject_GetAttr(workload, R.s_num_layers) : NULL;
            Py_XDECREF(workload);
            int last = layers ? int_eq(SLOT(first, R.h_layer), layers) : -1;
            Py_XDECREF(layers);
            if (last < 0) {
                Py_XDECREF(reduced);
                return -1;
            }
            *pair = last ? 0 : 2; /* a backward layer's pair: the key's 2 (collectives.collective_duration) */
        }
        kind = PyObject_GetAttr(first, R.s_kind);
        *label = kind ? PyUnicode_Concat(kind, R.s_partial_sums) : NULL;
        *results = *label ? repeated(reduced, n) : NULL;
        Py_XDECREF(reduced);
    } else if (op == R.all_gather && (type == R.ActivationSlice || type == R.ActivationGradSlice)) { /* TP pieces */
        int same = all_equal(works, R.h_samples);
        if (same == 1) same = all_equal(works, R.h_tp_size);
        if (same != 1) return same;
        if (small_int(SLOT(first, R.h_tp_size), -1) != n) return 0;
        if (!(all = disjoint_union(works, R.h_tp_parts))) return PyErr_Occurred() ? -1 : 0;
        Py_DECREF(all);
        PyObject *list = PyList_New(n);
        if (!list) return -1;
        for (Py_ssize_t i = 0; i < n; i++) { /* allocated at issue as the whole tensor */
            PyObject *out = SLOT(PyList_GET_ITEM(works, i), R.w_result);
            if (!out || !PyObject_TypeCheck(out, &BufferType)) {
                Py_DECREF(list);
                return 0;
            }
            PyList_SET_ITEM(list, i, Py_NewRef(out));
        }
        kind = PyObject_GetAttr(first, R.s_kind);
        *label = kind ? PyUnicode_Concat(kind, R.s_gather) : NULL;
        *results = list;
        if (!*label) Py_CLEAR(*results);
        first = PyList_GET_ITEM(list, 0); /* its bytes are the cost's */
    } else {
        return 0;
    }
    Py_XDECREF(kind);
    if (*results) *nbytes = PyLong_FromLongLong(BUFFER_NBYTES((Buffer *)first));
    if (*results && *nbytes) return 1;
    Py_CLEAR(*results);
    Py_CLEAR(*label);
    return -1;
}

/* Are coll's books those of a complete Collective of the Python classes whose group's books are too? */
static int resolvable(PyObject *coll) {
    if (Py_TYPE(coll) != R.Collective) return 0;
    PyObject *group = SLOT(coll, R.c_group), *works = SLOT(coll, R.c_works), *op = SLOT(coll, R.c_op);
    if (!group || Py_TYPE(group) != R.Group || !works || !PyList_CheckExact(works) || PyList_GET_SIZE(works) < 1 ||
        !op || !SLOT(coll, R.c_seq))
        return 0;
    PyObject *pending = SLOT(group, R.g_pending), *costs = SLOT(group, R.g_costs), *ready = SLOT(group, R.g_ready);
    if (!pending || !PyDict_CheckExact(pending) || !costs || !PyDict_CheckExact(costs) || !ready ||
        !PyList_CheckExact(ready) || !SLOT(group, R.g_busy))
        return 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(works); i++) {
        PyObject *work = PyList_GET_ITEM(works, i);
        if (Py_TYPE(work) != R.Work || !SLOT(work, R.w_input)) return 0;
    }
    return 1;
}

static PyObject *comm_resolve_ready(PyObject *engine, PyObject *coll) {
    if (!resolvable(coll)) goto slow;
    PyObject *results = NULL, *nbytes = NULL, *label = NULL;
    int pair;
    int done = combine(engine, coll, &results, &nbytes, &label, &pair);
    if (done < 0) return NULL;
    if (!done) goto slow;
    PyObject *group = SLOT(coll, R.c_group);
    PyObject *kind = pair == 2 ? PyLong_FromLong(2) : Py_NewRef(pair ? Py_True : Py_False);
    PyObject *key = kind ? PyTuple_Pack(3, SLOT(coll, R.c_op), nbytes, kind) : NULL;
    Py_XDECREF(kind);
    PyObject *duration = key ? PyDict_GetItemWithError(SLOT(group, R.g_costs), key) : NULL;
    Py_XDECREF(key);
    if (!duration) { /* a cost not computed yet: the Python computes it (and everything else again) */
        Py_DECREF(results);
        Py_DECREF(nbytes);
        Py_DECREF(label);
        if (PyErr_Occurred()) return NULL;
        goto slow;
    }
    Py_INCREF(duration);
    Py_XSETREF(SLOT(coll, R.c_results), results);
    Py_XSETREF(SLOT(coll, R.c_nbytes), nbytes);
    Py_XSETREF(SLOT(coll, R.c_label), label);
    Py_XSETREF(SLOT(coll, R.c_duration), duration);
    Py_INCREF(coll); /* the pending dict may hold the only other reference */
    PyObject *ret = NULL;
    if (PyDict_DelItem(SLOT(group, R.g_pending), SLOT(coll, R.c_seq)) == 0) {
        int busy = PyObject_IsTrue(SLOT(group, R.g_busy));
        if (busy > 0)
            ret = PyList_Append(SLOT(group, R.g_ready), coll) < 0 ? NULL : Py_NewRef(Py_None);
        else if (busy == 0)
            ret = comm_start(engine, coll);
    }
    Py_DECREF(coll);
    return ret;
slow:;
    PyObject *args[2] = {engine, coll};
    return PyObject_Vectorcall(R.py_resolve_ready, args, 2, NULL);
}

static PyObject *resolve_ready(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) return PyObject_Vectorcall(R.py_resolve_ready, args, nargs, NULL);
    return comm_resolve_ready(args[0], args[1]);
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef resolve_def = {"_resolve_ready", (PyCFunction)(void (*)(void))resolve_ready, METH_FASTCALL,
                                  "_resolve_ready(engine, coll)\n--\n\nEvery member has issued `coll`: the C twin "
                                  "of comm._resolve_ready."};

static int install_comm_resolve(PyObject *comm) {
    if (!R.s_kind) {
        struct { PyObject **out; const char *text; } strings[] = {
            {&R.s_kind, "kind"}, {&R.s_workload, "workload"}, {&R.s_num_layers, "num_layers"}, {&R.s_moe, "moe"},
            {&R.s_partial_sums, " (TP partial sums)"}, {&R.s_gather, "s (TP gather)"},
            {&R.all_reduce, "all_reduce"}, {&R.all_gather, "all_gather"},
        };
        for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
            if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
        if (!(R.one = PyLong_FromLong(1))) return -1;
    }
    const ClassRef classes[] = {
        {"Group", &R.Group}, {"Collective", &R.Collective}, {"Work", &R.Work}, {"Reduced", &R.Reduced},
        {"WeightGrad", &R.WeightGrad}, {"Activation", &R.Activation}, {"ActivationGrad", &R.ActivationGrad},
        {"ActivationSlice", &R.ActivationSlice}, {"ActivationGradSlice", &R.ActivationGradSlice},
    };
    if (load_classes(comm, "comm", classes, sizeof classes / sizeof classes[0]) < 0) return -1;
    PyObject *twins = PyObject_GetAttrString(comm, "PYTHON_TWINS");
    if (!twins) return -1;
    PyObject *py = PyDict_Check(twins) ? PyDict_GetItemString(twins, "_resolve_ready") : NULL;
    if (!py || !PyFunction_Check(py)) {
        Py_DECREF(twins);
        PyErr_SetString(PyExc_TypeError, "comm.PYTHON_TWINS must name the Python _resolve_ready");
        return -1;
    }
    Py_XSETREF(R.py_resolve_ready, Py_NewRef(py));
    Py_DECREF(twins);
    PyObject *Group = (PyObject *)R.Group, *Collective = (PyObject *)R.Collective, *Work = (PyObject *)R.Work;
    PyObject *WeightGrad = (PyObject *)R.WeightGrad, *Activation = (PyObject *)R.Activation;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Group, "pending", &R.g_pending}, {Group, "costs", &R.g_costs}, {Group, "busy", &R.g_busy},
        {Group, "ready", &R.g_ready},
        {Collective, "group", &R.c_group}, {Collective, "seq", &R.c_seq}, {Collective, "op", &R.c_op},
        {Collective, "works", &R.c_works}, {Collective, "results", &R.c_results}, {Collective, "nbytes", &R.c_nbytes},
        {Collective, "label", &R.c_label}, {Collective, "duration", &R.c_duration},
        {Work, "input", &R.w_input}, {Work, "result", &R.w_result},
        {WeightGrad, "samples", &R.t_samples}, {WeightGrad, "shards", &R.t_shards},
        {WeightGrad, "num_shards", &R.t_num_shards}, {WeightGrad, "tp_rank", &R.t_tp_rank},
        {WeightGrad, "tp_size", &R.t_tp_size},
        {Activation, "samples", &R.h_samples}, {Activation, "layer", &R.h_layer},
        {Activation, "tp_parts", &R.h_tp_parts}, {Activation, "tp_size", &R.h_tp_size},
        {(PyObject *)R.Reduced, "samples", &R.r_samples}, {(PyObject *)R.Reduced, "tp_parts", &R.r_tp_parts},
        {(PyObject *)R.Reduced, "tp_size", &R.r_tp_size},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return -1;
    const char *hidden[] = {"samples", "layer", "tp_parts", "tp_size"};
    Py_ssize_t want[] = {R.h_samples, R.h_layer, R.h_tp_parts, R.h_tp_size};
    PyObject *kinds[] = {(PyObject *)R.ActivationGrad, (PyObject *)R.ActivationSlice,
                         (PyObject *)R.ActivationGradSlice};
    if (same_layout(kinds, 3, hidden, want, 4) < 0) return -1;
    PyObject *c_resolve = PyCFunction_New(&resolve_def, NULL);
    if (!c_resolve) return -1;
    int failed = PyObject_SetAttrString(comm, "_resolve_ready", c_resolve);
    Py_DECREF(c_resolve);
    return failed ? -1 : 0;
}

/* ==== a member's issue: Model.all_reduce, all_gather, reduce_scatter ============================== */

/* C twins of `Model.all_reduce`, `Model.all_gather` and `Model.reduce_scatter`: `comm.issue_collective`
 * for weights, optimizer state and gradients, the all-reduce of a TP partial sum of an activation or its
 * gradient, and the all-gather of TP pieces of one; the first member's issue opens the Collective.
 *
 * As in `_tensor_ops.c`, the common valid call is handled exactly as `comm.issue_collective` does it (same checks,
 * same output allocation, same Collective and Work bookkeeping, and the resolution, above, at the
 * same moment: when the last member issues it), and every other call goes to the Python method, which stays
 * the specification: a keyword it does not know, a group given as ranks, a tensor of another kind, any
 * mismatch and any error. Nothing is changed before the fast path is sure to finish, so the Python method
 * starts from the same state. An output the rank has no memory for raises before the collective is opened
 * or the issue counted, in both paths: the group is left as it was.
 */

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, NUM_OPS };

static struct {
    PyTypeObject *Weight, *OptState, *WeightGrad, *Group, *Collective, *Work, *RankState, *Activation,
        *ActivationGrad, *ActivationSlice, *ActivationGradSlice;
    PyObject *py_ops[NUM_OPS]; /* the Python twins */
    PyObject *names[NUM_OPS];  /* "all_reduce", ...: a Collective's `op` is one of these interned strings */
    PyObject *docs;
    /* Model */
    Py_ssize_t m_engine, m_state, m_mem, m_world, m_act_bytes;
    /* MemoryTracker */
    Py_ssize_t mem_context;
    /* RankState */
    Py_ssize_t s_rank, s_clock;
    /* Group */
    Py_ssize_t g_index, g_size, g_next_seq, g_pending;
    /* Collective */
    Py_ssize_t c_group, c_seq, c_op, c_works, c_issued, c_first, c_results, c_nbytes, c_label, c_duration;
    /* Work */
    Py_ssize_t w_engine, w_rank, w_op, w_issue, w_end, w_result, w_input, w_future, w_peer;
    /* Weight, OptState and WeightGrad share these offsets (checked by `install_comm_ops`) */
    Py_ssize_t t_rank, t_layer, t_samples, t_shards, t_num_shards, t_tp_rank, t_tp_size;
    /* Activation and ActivationGrad (TP partial sums): rank, layer and samples as above, and these */
    Py_ssize_t h_tp_parts, h_tp_size;
    /* ActivationGradSlice: the group sizes of the all-gathers that made its gradient whole */
    Py_ssize_t gs_gathers;
    PyObject *s_group, *empty, *zero, *one, *zero_float;
} C;

/* A new int one more than `x`, or NULL (with an exception if out of memory; without one if x is odd). */
static PyObject *plus_one(PyObject *x) {
    long v = small_int(x, -1);
    return v < 0 || v >= LONG_MAX - 1 ? NULL : PyLong_FromLong(v + 1);
}

static PyObject *issue(int op, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs < 1 || nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0) > 2) goto slow;
    PyObject *x = args[0], *group = Py_None;
    if (nargs == 2) group = args[1];
    if (kwnames) {
        if (PyTuple_GET_ITEM(kwnames, 0) != C.s_group) goto slow;
        group = args[1];
    }
    if (group == Py_None) group = SLOT(self, C.m_world); /* None until the rank's first world collective */
    if (!group || Py_TYPE(group) != C.Group) goto slow;

    /* 1. the tensor: on this rank, and one this op takes (`collective_rules.unfit`) */
    PyTypeObject *type = Py_TYPE(x);
    PyObject *state = SLOT(self, C.m_state), *rank = SLOT(state, C.s_rank);
    int piece = type == C.ActivationSlice || type == C.ActivationGradSlice;
    if (piece) { /* all_gather of TP pieces */
        if (op != ALL_GATHER || int_eq(SLOT(x, C.t_rank), rank) != 1) goto slow;
        if (type == C.ActivationGradSlice && (!SLOT(x, C.gs_gathers) || !PyTuple_CheckExact(SLOT(x, C.gs_gathers))))
            goto slow;
    } else if (type == C.Activation || type == C.ActivationGrad) { /* all_reduce of a TP partial sum */
        long tp_size = small_int(SLOT(x, C.h_tp_size), -1);
        if (op != ALL_REDUCE || tp_size < 1 || is_full_mask(SLOT(x, C.h_tp_parts), tp_size) ||
            int_eq(SLOT(x, C.t_rank), rank) != 1)
            goto slow;
    } else {
        if (type != C.Weight && type != C.OptState && type != C.WeightGrad) goto slow;
        long num_shards = small_int(SLOT(x, C.t_num_shards), -1);
        if (num_shards < 1 || int_eq(SLOT(x, C.t_rank), rank) != 1) goto slow;
        int complete = is_full_mask(SLOT(x, C.t_shards), num_shards);
        if (op == ALL_REDUCE ? type != C.WeightGrad : op == ALL_GATHER ? complete : type != C.WeightGrad || !complete)
            goto slow;
    }
    if (buffer_log(x) != SLOT(self, C.m_mem)) goto slow; /* not this rank's tensor of this step */

    /* 2. the collective: this member's next one on the group, opened by another member or by this one */
    long size = small_int(SLOT(group, C.g_size), -1);
    PyObject *pos_obj = PyDict_GetItemWithError(SLOT(group, C.g_index), rank);
    long pos = small_int(pos_obj, -1);
    PyObject *next_seq = SLOT(group, C.g_next_seq);
    if (pos < 0 || pos >= size || !PyList_CheckExact(next_seq) || PyList_GET_SIZE(next_seq) != size) goto slow;
    PyObject *seq = PyList_GET_ITEM(next_seq, pos);
    PyObject *pending = SLOT(group, C.g_pending);
    if (!pending || !PyDict_CheckExact(pending)) goto slow;
    PyObject *coll = PyDict_GetItemWithError(pending, seq), *opened = NULL;
    if (coll) {
        if (Py_TYPE(coll) != C.Collective) goto slow;
        PyObject *works = SLOT(coll, C.c_works), *first = SLOT(coll, C.c_first);
        if (!works || !PyList_CheckExact(works) || PyList_GET_SIZE(works) != size || !first ||
            Py_TYPE(first) != C.Work)
            goto slow;
        /* `collective_rules.check_match`: the same op on a tensor of the same class, layer and size */
        PyObject *theirs = SLOT(first, C.w_input);
        if (SLOT(coll, C.c_op) != C.names[op] || !theirs || Py_TYPE(theirs) != type ||
            int_eq(SLOT(theirs, C.t_layer), SLOT(x, C.t_layer)) != 1 ||
            BUFFER_NBYTES((Buffer *)theirs) != BUFFER_NBYTES((Buffer *)x))
            goto slow;
    } else if (PyErr_Occurred()) {
        goto slow;
    }
    PyObject *clock = SLOT(state, C.s_clock);
    if (!clock) goto slow;
    long long nbytes = BUFFER_NBYTES((Buffer *)x);
    if (piece) { /* TP pieces gather into the whole activation (or gradient) of their samples */
        long count = mask_bit_count(SLOT(x, C.t_samples));
        long long each = small_int(SLOT(self, C.m_act_bytes), -1);
        if (count < 0 || each < 0 || (count && each > (long long)NBYTES_MASK / count)) goto slow;
        nbytes = count * each;
    } else if (op == ALL_GATHER) {
        if (nbytes > (long long)(NBYTES_MASK / (unsigned long long)size)) goto slow;
        nbytes *= size;
    } else if (op == REDUCE_SCATTER) {
        nbytes /= size;
    }

    /* 3. everything new, before anything changes */
    if (!coll) { /* `comm.Collective(group, seq, op)` */
        PyObject *works = PyList_New(size), *results = works ? PyList_New(0) : NULL;
        opened = results ? C.Collective->tp_alloc(C.Collective, 0) : NULL;
        if (!opened) {
            Py_XDECREF(works);
            Py_XDECREF(results);
            return NULL;
        }
        for (long i = 0; i < size; i++) PyList_SET_ITEM(works, i, Py_NewRef(Py_None));
        struct { Py_ssize_t offset; PyObject *value; } fields[] = {
            {C.c_group, group}, {C.c_seq, seq}, {C.c_op, C.names[op]}, {C.c_issued, C.zero}, {C.c_first, Py_None},
            {C.c_nbytes, C.zero}, {C.c_label, C.empty}, {C.c_duration, C.zero_float},
        };
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
            SLOT(opened, fields[i].offset) = Py_NewRef(fields[i].value);
        SLOT(opened, C.c_works) = works;
        SLOT(opened, C.c_results) = results;
        coll = opened;
    }
    PyObject *next = plus_one(seq), *issued = next ? plus_one(SLOT(coll, C.c_issued)) : NULL;
    if (!issued) {
        Py_XDECREF(next);
        Py_XDECREF(opened);
        if (PyErr_Occurred()) return NULL;
        goto slow;
    }
    PyObject *result = Py_NewRef(Py_None);
    if (op != ALL_REDUCE) { /* the output is allocated now (`collective_rules.combine` fills in its fields) */
        PyObject *mem = SLOT(self, C.m_mem), *context = PyTuple_Pack(2, C.names[op], SLOT(x, C.t_layer));
        if (context) Py_XSETREF(SLOT(mem, C.mem_context), context); /* what an out-of-memory error names */
        if (!context) {
            Py_CLEAR(result);
        } else if (type == C.ActivationSlice) {
            PyObject *whole[3] = {rank, SLOT(x, C.t_layer), SLOT(x, C.t_samples)};
            Py_SETREF(result, buffer_alloc(C.Activation, (AllocLog *)mem, nbytes, whole, 3));
        } else if (piece) { /* a gradient counts the gathers that made it whole: its piece's, and this one */
            PyObject *before = SLOT(x, C.gs_gathers);
            Py_ssize_t count = PyTuple_GET_SIZE(before);
            PyObject *gathers = PyTuple_New(count + 1), *last = gathers ? PyLong_FromLong(size) : NULL;
            if (last) {
                for (Py_ssize_t i = 0; i < count; i++)
                    PyTuple_SET_ITEM(gathers, i, Py_NewRef(PyTuple_GET_ITEM(before, i)));
                PyTuple_SET_ITEM(gathers, count, last);
                PyObject *whole[6] = {rank, SLOT(x, C.t_layer), SLOT(x, C.t_samples), C.one, C.one, gathers};
                Py_SETREF(result, buffer_alloc(C.ActivationGrad, (AllocLog *)mem, nbytes, whole, 6));
            } else {
                Py_CLEAR(result);
            }
            Py_XDECREF(gathers);
        } else {
            Py_SETREF(result, buffer_clone((AllocLog *)mem, nbytes, x));
        }
    }
    PyObject *work = result ? C.Work->tp_alloc(C.Work, 0) : NULL;
    if (!work) {
        Py_XDECREF(result);
        Py_DECREF(next);
        Py_DECREF(issued);
        Py_XDECREF(opened);
        return NULL;
    }
    if (opened && PyDict_SetItem(pending, seq, opened) < 0) {
        Py_DECREF(result);
        Py_DECREF(next);
        Py_DECREF(issued);
        Py_DECREF(opened);
        Py_DECREF(work);
        return NULL;
    }
    struct { Py_ssize_t offset; PyObject *value; } fields[] = {
        {C.w_engine, SLOT(self, C.m_engine)}, {C.w_rank, rank}, {C.w_op, C.names[op]}, {C.w_issue, clock},
        {C.w_end, Py_None}, {C.w_result, result}, {C.w_input, x}, {C.w_future, Py_None}, {C.w_peer, coll},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        SLOT(work, fields[i].offset) = Py_NewRef(fields[i].value);
    Py_DECREF(result);

    /* 4. the books: this member has issued it; the last member's issue resolves it */
    PyList_SetItem(next_seq, pos, next); /* steals `next` */
    PyList_SetItem(SLOT(coll, C.c_works), pos, Py_NewRef(work));
    long count = small_int(issued, -1);
    Py_SETREF(SLOT(coll, C.c_issued), issued);
    if (opened) {
        Py_SETREF(SLOT(coll, C.c_first), Py_NewRef(work));
        Py_DECREF(opened); /* group.pending holds it */
    }
    if (count == size) {
        PyObject *done = comm_resolve_ready(SLOT(self, C.m_engine), coll);
        if (!done) {
            Py_DECREF(work);
            return NULL;
        }
        Py_DECREF(done);
    }
    return work;
slow:
    return fallback(C.py_ops[op], self, args, nargs, kwnames);
}

static PyObject *fast_all_reduce(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return issue(ALL_REDUCE, self, args, nargs, kwnames);
}

static PyObject *fast_all_gather(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return issue(ALL_GATHER, self, args, nargs, kwnames);
}

static PyObject *fast_reduce_scatter(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    return issue(REDUCE_SCATTER, self, args, nargs, kwnames);
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef op_defs[NUM_OPS] = {
    {"all_reduce", (PyCFunction)(void (*)(void))fast_all_reduce, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"all_gather", (PyCFunction)(void (*)(void))fast_all_gather, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"reduce_scatter", (PyCFunction)(void (*)(void))fast_reduce_scatter, METH_FASTCALL | METH_KEYWORDS, NULL},
};

/* comm's attribute `name`, which must be a class when `is_type`. */
static int comm_attr(PyObject *comm, const char *name, int is_type, PyObject **out) {
    PyObject *value = PyObject_GetAttrString(comm, name);
    if (!value) return -1;
    if (is_type && !PyType_Check(value)) {
        PyErr_Format(PyExc_TypeError, "comm.%s is not a class", name);
        Py_DECREF(value);
        return -1;
    }
    Py_XSETREF(*out, value);
    return 0;
}


/* The names and constants the twin reads, made once, by the first install. */
static int comm_ops_names(void) {
    if (C.names[0]) return 0;
    const char *names[NUM_OPS] = {"all_reduce", "all_gather", "reduce_scatter"};
    for (int op = 0; op < NUM_OPS; op++)
        if (!(C.names[op] = PyUnicode_InternFromString(names[op]))) return -1;
    struct { PyObject **out; const char *text; } strings[] = {
        {&C.s_group, "group"}, {&C.empty, ""},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    if (!(C.zero = PyLong_FromLong(0)) || !(C.one = PyLong_FromLong(1)) || !(C.zero_float = PyFloat_FromDouble(0.0)))
        return -1;
    return 0;
}

PyObject *install_comm_ops(PyObject *module, PyObject *args) {
    if (comm_ops_names() < 0) return NULL;
    PyObject *Model, *RankState, *MemoryTracker, *comm, *Weight, *OptState, *WeightGrad, *docs;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!:install_comm_ops", &PyType_Type, &Model, &PyType_Type, &RankState,
                          &PyType_Type, &MemoryTracker, &PyModule_Type, &comm, &PyType_Type, &Weight, &PyType_Type,
                          &OptState, &PyType_Type, &WeightGrad, &PyDict_Type, &docs))
        return NULL;
    if (comm_attr(comm, "Group", 1, (PyObject **)&C.Group) < 0 ||
        comm_attr(comm, "Collective", 1, (PyObject **)&C.Collective) < 0 ||
        comm_attr(comm, "Work", 1, (PyObject **)&C.Work) < 0 ||
        comm_attr(comm, "Activation", 1, (PyObject **)&C.Activation) < 0 ||
        comm_attr(comm, "ActivationGrad", 1, (PyObject **)&C.ActivationGrad) < 0 ||
        comm_attr(comm, "ActivationSlice", 1, (PyObject **)&C.ActivationSlice) < 0 ||
        comm_attr(comm, "ActivationGradSlice", 1, (PyObject **)&C.ActivationGradSlice) < 0)
        return NULL;
    PyObject *Activation = (PyObject *)C.Activation, *ActivationGrad = (PyObject *)C.ActivationGrad;
    PyObject *Group = (PyObject *)C.Group, *Collective = (PyObject *)C.Collective, *Work = (PyObject *)C.Work;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Model, "_engine", &C.m_engine}, {Model, "_state", &C.m_state}, {Model, "_mem", &C.m_mem},
        {Model, "_world", &C.m_world}, {Model, "_act_bytes", &C.m_act_bytes},
        {MemoryTracker, "context", &C.mem_context},
        {RankState, "rank", &C.s_rank}, {RankState, "clock", &C.s_clock},
        {Group, "index", &C.g_index}, {Group, "size", &C.g_size}, {Group, "next_seq", &C.g_next_seq},
        {Group, "pending", &C.g_pending}, {Collective, "group", &C.c_group}, {Collective, "seq", &C.c_seq},
        {Collective, "op", &C.c_op}, {Collective, "works", &C.c_works}, {Collective, "issued", &C.c_issued},
        {Collective, "first", &C.c_first}, {Collective, "results", &C.c_results},
        {Collective, "nbytes", &C.c_nbytes}, {Collective, "label", &C.c_label},
        {Collective, "duration", &C.c_duration},
        {Work, "engine", &C.w_engine}, {Work, "rank", &C.w_rank}, {Work, "op", &C.w_op}, {Work, "issue", &C.w_issue},
        {Work, "end", &C.w_end}, {Work, "result", &C.w_result}, {Work, "input", &C.w_input},
        {Work, "future", &C.w_future}, {Work, "peer", &C.w_peer},
        {Weight, "rank", &C.t_rank}, {Weight, "layer", &C.t_layer}, {Weight, "samples", &C.t_samples},
        {Weight, "shards", &C.t_shards}, {Weight, "num_shards", &C.t_num_shards}, {Weight, "tp_rank", &C.t_tp_rank},
        {Weight, "tp_size", &C.t_tp_size}, {Activation, "tp_parts", &C.h_tp_parts},
        {Activation, "tp_size", &C.h_tp_size}, {(PyObject *)C.ActivationGradSlice, "gathers", &C.gs_gathers},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return NULL;
    const char *shared[] = {"rank", "layer", "samples", "shards", "num_shards", "tp_rank", "tp_size"};
    Py_ssize_t want[] = {C.t_rank, C.t_layer, C.t_samples, C.t_shards, C.t_num_shards, C.t_tp_rank, C.t_tp_size};
    PyObject *siblings[] = {OptState, WeightGrad};
    if (same_layout(siblings, 2, shared, want, 7) < 0) return NULL;
    const char *hidden[] = {"rank", "layer", "samples", "tp_parts", "tp_size"};
    Py_ssize_t hidden_want[] = {C.t_rank, C.t_layer, C.t_samples, C.h_tp_parts, C.h_tp_size};
    PyObject *hidden_kinds[] = {Activation, ActivationGrad, (PyObject *)C.ActivationSlice,
                                (PyObject *)C.ActivationGradSlice};
    if (same_layout(hidden_kinds, 4, hidden, hidden_want, 5) < 0) return NULL;
    PyObject *given[] = {Weight, OptState, WeightGrad, RankState};
    PyTypeObject **types[] = {&C.Weight, &C.OptState, &C.WeightGrad, &C.RankState};
    for (int i = 0; i < 4; i++) Py_XSETREF(*types[i], (PyTypeObject *)Py_NewRef(given[i]));
    Py_XSETREF(C.docs, Py_NewRef(docs));
    for (int op = 0; op < NUM_OPS; op++)
        if (replace_method(Model, &op_defs[op], &C.py_ops[op], C.docs) < 0) return NULL;
    /* the Python methods join the module's other Python twins (for tests that run both) */
    PyObject *twins = PyObject_GetAttrString(comm, "PYTHON_TWINS");
    if (!twins) return NULL;
    for (int op = 0; op < NUM_OPS && PyDict_Check(twins); op++)
        if (PyDict_SetItem(twins, C.names[op], C.py_ops[op]) < 0) { Py_DECREF(twins); return NULL; }
    Py_DECREF(twins);
    if (install_comm_end(comm, RankState) < 0 || install_comm_resolve(comm) < 0 ||
        install_work(comm, RankState, MemoryTracker) < 0)
        return NULL;
    Py_RETURN_NONE;
}

