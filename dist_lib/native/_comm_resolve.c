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
#include "_comm.h"

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
    PyObject *s_kind, *s_workload, *s_num_layers, *s_partial_sums, *s_gather, *one;
} R;

/* The union of the members' masks at `offset` if no two overlap (a new reference); NULL without an exception
 * if two do (the Python names them); NULL with one on failure. */
static PyObject *disjoint_union(PyObject *works, Py_ssize_t offset) {
    Py_ssize_t n = PyList_GET_SIZE(works);
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
 * label and whether it is a layer's pair of TP all-reduces (the cost key's last field). 1 when done, 0 when
 * the Python must do it, -1 with an exception. */
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
        } else { /* the LM head's input gradient is one all-reduce, a layer's two */
            PyObject *workload = PyObject_GetAttr(engine, R.s_workload);
            PyObject *layers = workload ? PyObject_GetAttr(workload, R.s_num_layers) : NULL;
            Py_XDECREF(workload);
            int last = layers ? int_eq(SLOT(first, R.h_layer), layers) : -1;
            Py_XDECREF(layers);
            if (last < 0) {
                Py_XDECREF(reduced);
                return -1;
            }
            *pair = !last;
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

PyObject *comm_resolve_ready(PyObject *engine, PyObject *coll) {
    if (!resolvable(coll)) goto slow;
    PyObject *results = NULL, *nbytes = NULL, *label = NULL;
    int pair;
    int done = combine(engine, coll, &results, &nbytes, &label, &pair);
    if (done < 0) return NULL;
    if (!done) goto slow;
    PyObject *group = SLOT(coll, R.c_group);
    PyObject *key = PyTuple_Pack(3, SLOT(coll, R.c_op), nbytes, pair ? Py_True : Py_False);
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

int install_comm_resolve(PyObject *comm) {
    if (!R.s_kind) {
        struct { PyObject **out; const char *text; } strings[] = {
            {&R.s_kind, "kind"}, {&R.s_workload, "workload"}, {&R.s_num_layers, "num_layers"},
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
