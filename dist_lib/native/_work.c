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
#include "_comm.h"

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

int install_work(PyObject *comm, PyObject *RankState, PyObject *MemoryTracker) {
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
