/* C twins of the start and the end of a collective on its group's stream: `comm._start` and `comm._finish`
 * (with `comm.release`), as `_p2p_ops.c` has them for messages.
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
#include "_comm.h"

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

PyObject *comm_start(PyObject *engine, PyObject *coll) {
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
    if (!(start = PyObject_GetAttr(transfer, E.s_start)) || !(end = PyObject_GetAttr(transfer, E.s_end))) goto done;
    if (!(ranks = PyObject_GetAttr(engine, E.s_ranks)) || !(log = PyObject_GetAttr(engine, E.s_events)) ||
        !(recent = PyObject_GetAttr(log, E.s_recent)))
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
            PyObject *call[2] = {engine, work};
            PyObject *r = PyObject_VectorcallMethod(E.s_wake, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
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

int install_comm_end(PyObject *comm, PyObject *RankState) {
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
