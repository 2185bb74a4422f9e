/* C twins of `Model.all_reduce`, `Model.all_gather` and `Model.reduce_scatter`: `comm.issue_collective`
 * for weights, optimizer state and gradients, the all-reduce of a TP partial sum of an activation or its
 * gradient, and the all-gather of TP pieces of one; the first member's issue opens the Collective.
 *
 * As in `_ops.c`, the common valid call is handled exactly as `comm.issue_collective` does it (same checks,
 * same output allocation, same Collective and Work bookkeeping, and the resolution, `_comm_resolve.c`, at the
 * same moment: when the last member issues it), and every other call goes to the Python method, which stays
 * the specification: a keyword it does not know, a group given as ranks, a tensor of another kind, any
 * mismatch and any error. Nothing is changed before the fast path is sure to finish, so the Python method
 * starts from the same state. An output the rank has no memory for raises before the collective is opened
 * or the issue counted, in both paths: the group is left as it was.
 */
#include "_comm.h"

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


static PyObject *install_comm_ops(PyObject *module, PyObject *args) {
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

static PyMethodDef comm_ops_methods[] = {
    {"install_comm_ops", install_comm_ops, METH_VARARGS,
     "install_comm_ops(Model, RankState, MemoryTracker, comm, Weight, OptState, WeightGrad, docs): put the C "
     "all_reduce, all_gather and reduce_scatter on Model; the Python methods stay their fallback."},
    {NULL}};

int comm_ops_init(PyObject *module) {
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
    return PyModule_AddFunctions(module, comm_ops_methods);
}
