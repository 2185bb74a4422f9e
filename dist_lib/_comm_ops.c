/* C twins of `Model.all_reduce`, `Model.all_gather` and `Model.reduce_scatter`: `comm.issue_collective`
 * for a member that joins a collective another member opened.
 *
 * As in `_ops.c`, the common valid call is handled exactly as `comm.issue_collective` does it (same
 * checks, same output allocation, same Work bookkeeping, and `comm._resolve_ready` called at the same
 * moment: when the last member issues it), and every other call goes to the Python method, which stays the specification: a
 * keyword it does not know, a group given as ranks, a tensor that is not a weight, optimizer state or
 * gradient, the first member of a collective (Python opens it), any mismatch and any error. Nothing is
 * changed before the fast path is sure to finish, so the Python method starts from the same state.
 */
#include "_ops.h"

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, NUM_OPS };

static struct {
    PyTypeObject *Weight, *OptState, *WeightGrad, *Group, *Collective, *Work, *RankState;
    PyObject *py_ops[NUM_OPS]; /* the Python twins */
    PyObject *names[NUM_OPS];  /* "all_reduce", ...: a Collective's `op` is one of these interned strings */
    PyObject *resolve_ready;   /* comm._resolve_ready */
    PyObject *py_resolve;      /* comm._resolve, the twin of `fast_resolve` */
    PyObject *Reduced;         /* comm._Reduced */
    PyObject *grad_kind;       /* WeightGrad.kind, an all-reduced gradient's label */
    PyObject *docs;
    /* Model */
    Py_ssize_t m_engine, m_state, m_mem, m_world;
    /* MemoryTracker */
    Py_ssize_t mem_context;
    /* RankState */
    Py_ssize_t s_rank, s_clock, s_comm_end, s_outstanding;
    /* Group */
    Py_ssize_t g_ranks, g_index, g_size, g_next_seq, g_pending, g_costs, g_free;
    /* Collective */
    Py_ssize_t c_group, c_seq, c_op, c_works, c_issued, c_op_id, c_first;
    /* Work */
    Py_ssize_t w_engine, w_rank, w_op, w_issue, w_end, w_result, w_input, w_future, w_peer;
    /* Weight, OptState and WeightGrad share these offsets (checked by `install_comm_ops`) */
    Py_ssize_t t_rank, t_layer, t_samples, t_shards, t_num_shards, t_tp_rank, t_tp_size;
    PyObject *s_group, *s_collective, *s_events, *s_recent, *s_wake, *s_maybe_pack, *zero_float;
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

    /* 1. the tensor: on this rank, and one this op takes (`comm._unfit`) */
    PyTypeObject *type = Py_TYPE(x);
    if (type != C.Weight && type != C.OptState && type != C.WeightGrad) goto slow;
    PyObject *state = SLOT(self, C.m_state), *rank = SLOT(state, C.s_rank);
    long num_shards = small_int(SLOT(x, C.t_num_shards), -1);
    if (num_shards < 1 || int_eq(SLOT(x, C.t_rank), rank) != 1) goto slow;
    int complete = is_full_mask(SLOT(x, C.t_shards), num_shards);
    if (op == ALL_REDUCE ? type != C.WeightGrad : op == ALL_GATHER ? complete : type != C.WeightGrad || !complete)
        goto slow;

    /* 2. the collective: this member's next one on the group, opened by another member */
    long size = small_int(SLOT(group, C.g_size), -1);
    PyObject *pos_obj = PyDict_GetItemWithError(SLOT(group, C.g_index), rank);
    long pos = small_int(pos_obj, -1);
    PyObject *next_seq = SLOT(group, C.g_next_seq);
    if (pos < 0 || pos >= size || !PyList_CheckExact(next_seq) || PyList_GET_SIZE(next_seq) != size) goto slow;
    PyObject *seq = PyList_GET_ITEM(next_seq, pos);
    PyObject *coll = PyDict_GetItemWithError(SLOT(group, C.g_pending), seq);
    if (!coll || Py_TYPE(coll) != C.Collective) goto slow;
    PyObject *works = SLOT(coll, C.c_works), *first = SLOT(coll, C.c_first);
    if (!works || !PyList_CheckExact(works) || PyList_GET_SIZE(works) != size || !first ||
        Py_TYPE(first) != C.Work)
        goto slow;
    /* `comm._check_match`: the same op on a tensor of the same class, layer and size */
    PyObject *theirs = SLOT(first, C.w_input);
    if (SLOT(coll, C.c_op) != C.names[op] || !theirs || Py_TYPE(theirs) != type ||
        int_eq(SLOT(theirs, C.t_layer), SLOT(x, C.t_layer)) != 1 ||
        BUFFER_NBYTES((Buffer *)theirs) != BUFFER_NBYTES((Buffer *)x))
        goto slow;
    PyObject *outstanding = SLOT(state, C.s_outstanding), *clock = SLOT(state, C.s_clock);
    if (!outstanding || !PyList_CheckExact(outstanding) || !clock) goto slow;
    long long nbytes = BUFFER_NBYTES((Buffer *)x);
    if (op == ALL_GATHER && nbytes > (long long)(NBYTES_MASK / (unsigned long long)size)) goto slow;

    /* 3. everything new, before anything changes */
    PyObject *next = plus_one(seq), *issued = next ? plus_one(SLOT(coll, C.c_issued)) : NULL;
    if (!issued) {
        Py_XDECREF(next);
        if (PyErr_Occurred()) return NULL;
        goto slow;
    }
    PyObject *result = Py_NewRef(Py_None);
    if (op != ALL_REDUCE) { /* the output is allocated now (`comm._combine` fills in its fields) */
        PyObject *mem = SLOT(self, C.m_mem), *context = PyTuple_Pack(2, C.names[op], SLOT(x, C.t_layer));
        if (context) Py_XSETREF(SLOT(mem, C.mem_context), context); /* what an out-of-memory error names */
        Py_SETREF(result, context ? buffer_clone((AllocLog *)mem, op == ALL_GATHER ? nbytes * size : nbytes / size, x)
                                  : NULL);
    }
    PyObject *work = result ? C.Work->tp_alloc(C.Work, 0) : NULL;
    if (!work) {
        Py_XDECREF(result);
        Py_DECREF(next);
        Py_DECREF(issued);
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
    PyList_SetItem(works, pos, Py_NewRef(work));
    long count = small_int(issued, -1);
    Py_SETREF(SLOT(coll, C.c_issued), issued);
    if (PyList_Append(outstanding, work) < 0) {
        Py_DECREF(work);
        return NULL;
    }
    if (count == size) {
        PyObject *call[2] = {SLOT(self, C.m_engine), coll};
        PyObject *done = PyObject_Vectorcall(C.resolve_ready, call, 2, NULL);
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

/* ---- resolving an all-reduce of gradients -------------------------------------------------------- */

/* The union of disjoint sample masks, kept in 64 bits while they fit. */
typedef struct {
    unsigned long long bits;
    PyObject *wide; /* once a mask is wider than 64 bits: the union as an int */
} Union;

/* Add `mask` to the union: 1, or 0 if it overlaps (Python names the clash), or -1 with an exception. */
static int union_add(Union *u, PyObject *mask) {
    if (!u->wide) {
        unsigned long long v = PyLong_AsUnsignedLongLong(mask);
        if (!(v == (unsigned long long)-1 && PyErr_Occurred())) {
            if (u->bits & v) return 0;
            u->bits |= v;
            return 1;
        }
        PyErr_Clear(); /* wider than 64 bits (or negative): go on with ints */
        if (!(u->wide = PyLong_FromUnsignedLongLong(u->bits))) return -1;
    }
    PyObject *overlap = PyNumber_And(u->wide, mask);
    if (!overlap) return -1;
    int clash = PyObject_IsTrue(overlap);
    Py_DECREF(overlap);
    if (clash) return clash < 0 ? -1 : 0;
    PyObject *both = PyNumber_Or(u->wide, mask);
    if (!both) return -1;
    Py_SETREF(u->wide, both);
    return 1;
}

/* A float slot's value, or -1.0 if it is not an exact float (times are never negative). */
static double float_slot(PyObject *obj, Py_ssize_t offset) {
    PyObject *x = SLOT(obj, offset);
    return x && PyFloat_CheckExact(x) ? PyFloat_AS_DOUBLE(x) : -1.0;
}

/* `comm._resolve(engine, coll, states)` for an all-reduce of gradients (the common case: data parallel
 * gradients of one TP slice and ZeRO shard, disjoint samples, a cost the group has computed before):
 * the same start, end, results and events. Anything else goes to the Python `_resolve`. */
static PyObject *fast_resolve(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) goto slow;
    PyObject *engine = args[0], *coll = args[1], *states = args[2];
    if (Py_TYPE(coll) != C.Collective || SLOT(coll, C.c_op) != C.names[ALL_REDUCE] || !PyList_CheckExact(states))
        goto slow;
    PyObject *works = SLOT(coll, C.c_works), *group = SLOT(coll, C.c_group);
    Py_ssize_t n = PyList_GET_SIZE(states);
    if (!works || !PyList_CheckExact(works) || PyList_GET_SIZE(works) != n || n < 1 || !group ||
        Py_TYPE(group) != C.Group || Py_TYPE(PyList_GET_ITEM(works, 0)) != C.Work)
        goto slow;
    PyObject *first = SLOT(PyList_GET_ITEM(works, 0), C.w_input);
    if (!first || Py_TYPE(first) != C.WeightGrad) goto slow;

    /* 1. `_combine`'s checks: one TP slice and ZeRO shard, disjoint samples; the start time */
    Union samples = {0, NULL};
    double start = float_slot(group, C.g_free); /* the group's stream is free */
    if (start < 0) goto slow;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *work = PyList_GET_ITEM(works, i), *state = PyList_GET_ITEM(states, i);
        PyObject *t = Py_TYPE(work) == C.Work ? SLOT(work, C.w_input) : NULL;
        if (!t || Py_TYPE(t) != C.WeightGrad || Py_TYPE(state) != C.RankState) goto slow_union;
        if (i > 0) {
            const Py_ssize_t same[] = {C.t_tp_rank, C.t_tp_size, C.t_shards, C.t_num_shards};
            for (int f = 0; f < 4; f++)
                if (int_eq(SLOT(t, same[f]), SLOT(first, same[f])) != 1) goto slow_union;
        }
        double issue = float_slot(work, C.w_issue);
        if (issue < 0 || float_slot(state, C.s_comm_end) < 0) goto slow_union;
        if (issue > start) start = issue;
        PyObject *mask = SLOT(t, C.t_samples);
        if (!mask || !PyLong_CheckExact(mask)) goto slow_union;
        int added = union_add(&samples, mask);
        if (added < 0) {
            Py_XDECREF(samples.wide);
            return NULL;
        }
        if (!added) goto slow_union;
    }
    /* 2. the cost, computed by Python the first time the group meets this size */
    PyObject *nbytes = PyLong_FromLongLong(BUFFER_NBYTES((Buffer *)first));
    PyObject *key = nbytes ? PyTuple_Pack(3, C.names[ALL_REDUCE], nbytes, Py_False) : NULL;
    PyObject *duration = key ? PyDict_GetItemWithError(SLOT(group, C.g_costs), key) : NULL;
    Py_XDECREF(key);
    if (!duration || !PyFloat_CheckExact(duration)) {
        Py_XDECREF(nbytes);
        if (PyErr_Occurred()) {
            Py_XDECREF(samples.wide);
            return NULL;
        }
        goto slow_union;
    }
    /* 3. everything new, before anything changes */
    PyObject *union_mask = samples.wide ? samples.wide : PyLong_FromUnsignedLongLong(samples.bits);
    PyObject *start_obj = union_mask ? PyFloat_FromDouble(start) : NULL;
    PyObject *end = start_obj ? PyFloat_FromDouble(start + PyFloat_AS_DOUBLE(duration)) : NULL;
    PyObject *reduced = end ? PyObject_CallOneArg(C.Reduced, union_mask) : NULL;
    PyObject *events = reduced ? PyObject_GetAttr(engine, C.s_events) : NULL;
    PyObject *recent = events ? PyObject_GetAttr(events, C.s_recent) : NULL;
    PyObject *empty = recent ? PyList_New(0) : NULL;
    PyObject *ok = NULL;
    if (!empty || !PyList_CheckExact(recent)) {
        if (empty) PyErr_SetString(PyExc_TypeError, "EventLog.recent is not a list");
        goto done;
    }
    /* 4. the books: the op leaves the group's pending ones; the group's stream; each member's Work,
     * latest collective end and event */
    if (PyDict_DelItem(SLOT(group, C.g_pending), SLOT(coll, C.c_seq)) < 0) goto done;
    Py_SETREF(SLOT(group, C.g_free), Py_NewRef(end));
    double end_time = PyFloat_AS_DOUBLE(end);
    PyObject *peers = SLOT(group, C.g_ranks), *layer = SLOT(first, C.t_layer), *op_id = SLOT(coll, C.c_op_id);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *work = PyList_GET_ITEM(works, i), *state = PyList_GET_ITEM(states, i);
        if (end_time > float_slot(state, C.s_comm_end)) Py_SETREF(SLOT(state, C.s_comm_end), Py_NewRef(end));
        Py_SETREF(SLOT(work, C.w_end), Py_NewRef(end));
        Py_SETREF(SLOT(work, C.w_result), Py_NewRef(reduced));
        PyObject *event = PyTuple_New(12);
        if (!event) goto done;
        PyObject *items[12] = {SLOT(state, C.s_rank), C.names[ALL_REDUCE], C.s_collective, start_obj, end, layer,
                               union_mask, nbytes, C.zero_float, peers, op_id, C.grad_kind};
        for (int k = 0; k < 12; k++) PyTuple_SET_ITEM(event, k, Py_NewRef(items[k]));
        int failed = PyList_Append(recent, event);
        Py_DECREF(event);
        if (failed) goto done;
        if (SLOT(work, C.w_future) != Py_None) { /* its rank waits on it */
            PyObject *woken = PyObject_CallMethodOneArg(engine, C.s_wake, work);
            if (!woken) goto done;
            Py_DECREF(woken);
        }
    }
    PyObject *packed = PyObject_CallMethodNoArgs(events, C.s_maybe_pack);
    if (!packed) goto done;
    Py_DECREF(packed);
    /* resolved: no Work <-> Collective cycle may outlive the step */
    Py_SETREF(SLOT(coll, C.c_works), empty);
    empty = NULL;
    Py_SETREF(SLOT(coll, C.c_first), Py_NewRef(Py_None));
    ok = Py_NewRef(Py_None);
done:
    Py_XDECREF(empty);
    Py_XDECREF(recent);
    Py_XDECREF(events);
    Py_XDECREF(reduced);
    Py_XDECREF(end);
    Py_XDECREF(start_obj);
    Py_XDECREF(union_mask);
    Py_DECREF(nbytes);
    return ok;
slow_union:
    Py_XDECREF(samples.wide);
slow:
    PyErr_Clear();
    return PyObject_Vectorcall(C.py_resolve, args, nargs, NULL);
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

static PyMethodDef resolve_def = {"_resolve", (PyCFunction)(void (*)(void))fast_resolve, METH_FASTCALL, NULL};

static PyObject *install_comm_ops(PyObject *module, PyObject *args) {
    PyObject *Model, *RankState, *MemoryTracker, *comm, *Weight, *OptState, *WeightGrad, *docs;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!:install_comm_ops", &PyType_Type, &Model, &PyType_Type, &RankState,
                          &PyType_Type, &MemoryTracker, &PyModule_Type, &comm, &PyType_Type, &Weight, &PyType_Type,
                          &OptState, &PyType_Type, &WeightGrad, &PyDict_Type, &docs))
        return NULL;
    if (comm_attr(comm, "Group", 1, (PyObject **)&C.Group) < 0 ||
        comm_attr(comm, "Collective", 1, (PyObject **)&C.Collective) < 0 ||
        comm_attr(comm, "Work", 1, (PyObject **)&C.Work) < 0 || comm_attr(comm, "_Reduced", 1, &C.Reduced) < 0 ||
        comm_attr(comm, "_resolve_ready", 0, &C.resolve_ready) < 0 || comm_attr(comm, "_resolve", 0, &C.py_resolve) < 0)
        return NULL;
    if (!PyFunction_Check(C.py_resolve)) {
        PyErr_SetString(PyExc_TypeError, "comm._resolve is not a Python function (installed twice?)");
        return NULL;
    }
    PyObject *Group = (PyObject *)C.Group, *Collective = (PyObject *)C.Collective, *Work = (PyObject *)C.Work;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Model, "_engine", &C.m_engine}, {Model, "_state", &C.m_state}, {Model, "_mem", &C.m_mem},
        {Model, "_world", &C.m_world}, {MemoryTracker, "context", &C.mem_context},
        {RankState, "rank", &C.s_rank}, {RankState, "clock", &C.s_clock}, {RankState, "comm_end", &C.s_comm_end},
        {RankState, "outstanding", &C.s_outstanding}, {Group, "free", &C.g_free},
        {Group, "ranks", &C.g_ranks}, {Group, "index", &C.g_index}, {Group, "size", &C.g_size},
        {Group, "next_seq", &C.g_next_seq}, {Group, "pending", &C.g_pending}, {Group, "costs", &C.g_costs},
        {Collective, "group", &C.c_group}, {Collective, "seq", &C.c_seq}, {Collective, "op", &C.c_op},
        {Collective, "works", &C.c_works}, {Collective, "issued", &C.c_issued}, {Collective, "op_id", &C.c_op_id},
        {Collective, "first", &C.c_first},
        {Work, "engine", &C.w_engine}, {Work, "rank", &C.w_rank}, {Work, "op", &C.w_op}, {Work, "issue", &C.w_issue},
        {Work, "end", &C.w_end}, {Work, "result", &C.w_result}, {Work, "input", &C.w_input},
        {Work, "future", &C.w_future}, {Work, "peer", &C.w_peer},
        {Weight, "rank", &C.t_rank}, {Weight, "layer", &C.t_layer}, {Weight, "samples", &C.t_samples},
        {Weight, "shards", &C.t_shards}, {Weight, "num_shards", &C.t_num_shards}, {Weight, "tp_rank", &C.t_tp_rank},
        {Weight, "tp_size", &C.t_tp_size},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return NULL;
    const char *shared[] = {"rank", "layer", "samples", "shards", "num_shards", "tp_rank", "tp_size"};
    Py_ssize_t want[] = {C.t_rank, C.t_layer, C.t_samples, C.t_shards, C.t_num_shards, C.t_tp_rank, C.t_tp_size};
    PyObject *siblings[] = {OptState, WeightGrad};
    if (same_layout(siblings, 2, shared, want, 7) < 0) return NULL;
    PyObject *kind = PyObject_GetAttrString(WeightGrad, "kind");
    if (!kind) return NULL;
    Py_XSETREF(C.grad_kind, kind);
    PyObject *given[] = {Weight, OptState, WeightGrad, RankState};
    PyTypeObject **types[] = {&C.Weight, &C.OptState, &C.WeightGrad, &C.RankState};
    for (int i = 0; i < 4; i++) Py_XSETREF(*types[i], (PyTypeObject *)Py_NewRef(given[i]));
    Py_XSETREF(C.docs, Py_NewRef(docs));
    for (int op = 0; op < NUM_OPS; op++)
        if (replace_method(Model, &op_defs[op], &C.py_ops[op], C.docs) < 0) return NULL;
    /* comm._resolve becomes the C twin; `_resolve_ready` finds it there */
    resolve_def.ml_doc = "_resolve(engine, coll, states): C twin of the Python `_resolve` for all-reduces of gradients";
    PyObject *resolve = PyCFunction_New(&resolve_def, NULL);
    if (!resolve) return NULL;
    int failed = PyObject_SetAttrString(comm, "_resolve", resolve);
    Py_DECREF(resolve);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef comm_ops_methods[] = {
    {"install_comm_ops", install_comm_ops, METH_VARARGS,
     "install_comm_ops(Model, RankState, MemoryTracker, comm, Weight, OptState, WeightGrad, docs): put the C "
     "all_reduce, all_gather and reduce_scatter on Model and the C _resolve in the comm module; the Python "
     "functions stay their fallback."},
    {NULL}};

int comm_ops_init(PyObject *module) {
    const char *names[NUM_OPS] = {"all_reduce", "all_gather", "reduce_scatter"};
    for (int op = 0; op < NUM_OPS; op++)
        if (!(C.names[op] = PyUnicode_InternFromString(names[op]))) return -1;
    struct { PyObject **out; const char *text; } strings[] = {
        {&C.s_group, "group"}, {&C.s_collective, "collective"}, {&C.s_events, "events"}, {&C.s_recent, "recent"},
        {&C.s_wake, "wake"}, {&C.s_maybe_pack, "maybe_pack"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    if (!(C.zero_float = PyFloat_FromDouble(0.0))) return -1;
    return PyModule_AddFunctions(module, comm_ops_methods);
}
