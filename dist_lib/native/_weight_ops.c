/* C twins of the per-layer weight ops: `Model.load_weights`, `Model.update` and `Model.set_final_weight`.
 *
 * As in `_ops.c`, each handles the common valid call exactly as the Python method in `model/handle.py` does
 * (same checks, cost-cache key, event and allocations) and hands every other call to that method, which
 * stays the specification: a keyword it does not know, a first use of a size or cost, an update that
 * allocates (a weight holding other ZeRO shards than its optimizer state), a layer's second shard
 * (`op_checks._first_time` then keeps a set), and any error. Nothing is changed before the fast path is
 * sure to finish, so the Python method starts from the same state.
 */
#include "_ops.h"

static struct {
    PyTypeObject *Weight, *OptState, *WeightGrad;
    PyObject *py_load, *py_update, *py_final; /* the Python twins */
    PyObject *docs;
    /* Model */
    Py_ssize_t m_state, m_mem, m_events, m_cache, m_rank, m_num_layers, m_shard_sizes, m_full_batch;
    /* RankState and MemoryTracker */
    Py_ssize_t s_clock, s_updated, s_handed, s_final_weights, s_loaded, mem_context;
    /* Weight, OptState and WeightGrad share these offsets (checked by `install_weight_ops`) */
    Py_ssize_t rank, layer, step, shards, num_shards, tp_rank, tp_size, samples;
    PyObject *s_load, *s_update, *s_compute, *s_empty, *s_shard, *s_num_shards, *s_tp_rank, *s_tp_size, *zero,
        *one, *zero_float;
} W;

/* `op_checks._shard_key(shards, num_shards, tp_rank)` for the ranges where C computes it as Python does;
 * NULL without an exception elsewhere (the caller takes the slow path). */
static PyObject *shard_key(PyObject *shards, PyObject *num_shards, PyObject *tp_rank) {
    long n = small_int(num_shards, -1), s = small_int(shards, -1), t = small_int(tp_rank, -1);
    if (n == 1) return Py_NewRef(tp_rank);
    if (n < 1 || n >= 1L << 16 || s < 0 || s >= 1L << 31 || t < 0 || t >= 1L << 16) return NULL;
    return PyLong_FromUnsignedLongLong(((unsigned long long)s << 16 | (unsigned long long)n) << 16 |
                                       (unsigned long long)t);
}

/* Is `layer`'s entry of `seen` (RankState.updated or .handed) still empty? When it is taken (the Python
 * `_first_time` decides then) or off the list, no. */
static int first_time(PyObject *seen, long layer) {
    return PyList_CheckExact(seen) && layer >= 0 && layer < PyList_GET_SIZE(seen) &&
           PyList_GET_ITEM(seen, layer) == Py_None;
}

/* t holds every parameter of the optimizer state's shards (`op_checks._covers`), for masks that fit a long. */
static int covers(PyObject *t, long opt_shards, long opt_num_shards) {
    long n = small_int(SLOT(t, W.num_shards), -1), s = small_int(SLOT(t, W.shards), -1);
    if (n < 1 || n > 62 || s < 0) return 0;
    return s == (1L << n) - 1 || (n == opt_num_shards && (s & opt_shards) == opt_shards);
}

/* ---- load_weights -------------------------------------------------------------------------------- */

static PyObject *fast_load_weights(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    /* layer, shard=0, num_shards=1, *, tp_rank=0, tp_size=1 */
    PyObject *given[5] = {NULL, W.zero, W.one, W.zero, W.one};
    PyObject *names[5] = {NULL, W.s_shard, W.s_num_shards, W.s_tp_rank, W.s_tp_size};
    if (nargs < 1 || nargs > 3) goto slow;
    for (Py_ssize_t i = 0; i < nargs; i++) given[i] = args[i];
    for (Py_ssize_t k = 0; kwnames && k < PyTuple_GET_SIZE(kwnames); k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int i = 1;
        while (i < 5 && names[i] != name) i++;
        if (i == 5 || i < nargs) goto slow; /* unknown, not interned, or given twice: Python says which */
        given[i] = args[nargs + k];
    }
    PyObject *layer = given[0], *shard = given[1], *num_shards = given[2], *tp_rank = given[3], *tp = given[4];
    long layer_v = small_int(layer, -1), shard_v = small_int(shard, -1), n = small_int(num_shards, -1);
    long t = small_int(tp_rank, -1), tp_v = small_int(tp, -1);
    if (!PyLong_CheckExact(layer) || layer_v < 0 || layer_v >= small_int(SLOT(self, W.m_num_layers), 0) ||
        shard_v < 0 || shard_v >= n || shard_v > 62 || t < 0 || t >= tp_v || tp_v > 1L << 20 || n > 1L << 20)
        goto slow;
    PyObject *parts = PyLong_FromLong(tp_v * n);
    if (!parts) return NULL;
    PyObject *key = PyTuple_Pack(2, layer, parts);
    Py_DECREF(parts);
    if (!key) return NULL;
    PyObject *sizes = PyDict_GetItemWithError(SLOT(self, W.m_shard_sizes), key);
    Py_DECREF(key);
    if (!sizes || !PyTuple_CheckExact(sizes) || PyTuple_GET_SIZE(sizes) != 2) {
        if (PyErr_Occurred()) return NULL;
        goto slow; /* the first time for this (layer, parts): Python computes and caches the sizes */
    }
    long long weight_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, 0));
    long long optimizer_bytes = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, 1));
    if (PyErr_Occurred()) return NULL;
    AllocLog *mem = (AllocLog *)SLOT(self, W.m_mem);
    PyObject *context = PyTuple_Pack(2, W.s_load, layer);
    if (!context) return NULL;
    Py_XSETREF(SLOT(mem, W.mem_context), context);
    PyObject *shards = PyLong_FromLong(1L << shard_v);
    if (!shards) return NULL;
    PyObject *load = PyTuple_Pack(5, layer, shards, num_shards, tp_rank, tp); /* RankState.loaded */
    if (!load || PyList_Append(SLOT(SLOT(self, W.m_state), W.s_loaded), load) < 0) {
        Py_XDECREF(load);
        Py_DECREF(shards);
        return NULL;
    }
    Py_DECREF(load);
    PyObject *fields[8] = {SLOT(self, W.m_rank), layer, W.zero, shards, num_shards, tp_rank, tp, W.zero};
    PyObject *weight = buffer_alloc(W.Weight, mem, weight_bytes, fields, 8), *result = NULL;
    PyObject *opt = weight ? buffer_alloc(W.OptState, mem, optimizer_bytes, fields, 8) : NULL;
    if (opt) result = PyTuple_Pack(2, weight, opt);
    Py_DECREF(shards);
    Py_XDECREF(weight);
    Py_XDECREF(opt);
    return result;
slow:
    return fallback(W.py_load, self, args, nargs, kwnames);
}

/* ---- update -------------------------------------------------------------------------------------- */

static PyObject *fast_update(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs != 4 || kwnames) goto slow;
    PyObject *layer = args[0], *grad = args[1], *weight = args[2], *opt = args[3], *rank = SLOT(self, W.m_rank);
    if (!PyLong_CheckExact(layer) || Py_TYPE(grad) != W.WeightGrad || Py_TYPE(weight) != W.Weight ||
        Py_TYPE(opt) != W.OptState)
        goto slow;
    PyObject *shards = SLOT(opt, W.shards), *num_shards = SLOT(opt, W.num_shards);
    PyObject *tp_rank = SLOT(opt, W.tp_rank), *tp = SLOT(opt, W.tp_size), *full = SLOT(self, W.m_full_batch);
    long layer_v = small_int(layer, -1), n = small_int(num_shards, -1), s = small_int(shards, -1);
    PyObject *state = SLOT(self, W.m_state);
    PyObject *updated = SLOT(state, W.s_updated);
    if (layer_v < 0 || n < 1 || n > 62 || s < 0 || !tp || !full || !first_time(updated, layer_v)) goto slow;
    PyObject *const tensors[3] = {grad, weight, opt};
    for (int i = 0; i < 3; i++)
        if (int_eq(SLOT(tensors[i], W.rank), rank) != 1 || int_eq(SLOT(tensors[i], W.layer), layer) != 1 ||
            buffer_log(tensors[i]) != SLOT(self, W.m_mem))
            goto slow;
    if (int_eq(SLOT(grad, W.tp_rank), tp_rank) != 1 || int_eq(SLOT(weight, W.tp_rank), tp_rank) != 1 ||
        int_eq(SLOT(grad, W.tp_size), tp) != 1 || int_eq(SLOT(weight, W.tp_size), tp) != 1 ||
        !covers(grad, s, n) || !covers(weight, s, n) || small_int(SLOT(weight, W.step), -1) != 0 ||
        small_int(SLOT(opt, W.step), -1) != 0 || int_eq(SLOT(grad, W.samples), full) != 1 ||
        /* updated in place: the weight holds the optimizer state's shards (else Python allocates) */
        int_eq(SLOT(weight, W.shards), shards) != 1 || int_eq(SLOT(weight, W.num_shards), num_shards) != 1)
        goto slow;
    PyObject *key_shard = shard_key(shards, num_shards, tp_rank);
    if (!key_shard) goto slow;
    PyObject *held = PyLong_FromLong(__builtin_popcountl(s));
    PyObject *cost_key = held ? PyTuple_Pack(5, W.s_update, layer, held, num_shards, tp) : NULL;
    Py_XDECREF(held);
    PyObject *cost = cost_key ? PyDict_GetItemWithError(SLOT(self, W.m_cache), cost_key) : NULL;
    Py_XDECREF(cost_key);
    if (!cost || !PyTuple_CheckExact(cost) || PyTuple_GET_SIZE(cost) != 2) {
        Py_DECREF(key_shard);
        if (PyErr_Occurred()) return NULL;
        goto slow; /* the first update of this shape on this device type: Python computes the cost */
    }
    PyObject *start = SLOT(state, W.s_clock);
    double duration = PyFloat_AsDouble(PyTuple_GET_ITEM(cost, 0));
    double start_s = start ? PyFloat_AsDouble(start) : -1.0;
    PyObject *end = PyErr_Occurred() || !start ? NULL : PyFloat_FromDouble(start_s + duration);
    PyObject *items[12] = {rank, W.s_update, W.s_compute, start, end, layer, full, PyTuple_GET_ITEM(cost, 1),
                           W.zero_float, Py_None, W.zero, W.s_empty};
    if (!end || append_event(SLOT(self, W.m_events), items) < 0) {
        Py_XDECREF(end);
        Py_DECREF(key_shard);
        return NULL;
    }
    PyList_SetItem(updated, layer_v, key_shard); /* steals `key_shard` */
    Py_SETREF(SLOT(state, W.s_clock), end);      /* the event holds its own reference */
    PyObject *fields[8] = {rank, layer, W.one, shards, num_shards, tp_rank, tp, full};
    PyObject *new_weight = buffer_view(W.Weight, weight, fields, 8), *result = NULL;
    PyObject *new_opt = new_weight ? buffer_view(W.OptState, opt, fields, 8) : NULL;
    if (new_opt) result = PyTuple_Pack(2, new_weight, new_opt);
    Py_XDECREF(new_weight);
    Py_XDECREF(new_opt);
    return result;
slow:
    return fallback(W.py_update, self, args, nargs, kwnames);
}

/* ---- set_final_weight ---------------------------------------------------------------------------- */

static PyObject *fast_set_final_weight(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames) {
    if (nargs != 2 || kwnames) goto slow;
    PyObject *layer = args[0], *weight = args[1], *state = SLOT(self, W.m_state);
    PyObject *handed = SLOT(state, W.s_handed), *finals = SLOT(state, W.s_final_weights);
    long layer_v = small_int(layer, -1);
    if (!PyLong_CheckExact(layer) || Py_TYPE(weight) != W.Weight || !finals || !PyList_CheckExact(finals) ||
        !first_time(handed, layer_v) || int_eq(SLOT(weight, W.rank), SLOT(self, W.m_rank)) != 1 ||
        int_eq(SLOT(weight, W.layer), layer) != 1 || buffer_log(weight) != SLOT(self, W.m_mem))
        goto slow;
    PyObject *key = shard_key(SLOT(weight, W.shards), SLOT(weight, W.num_shards), SLOT(weight, W.tp_rank));
    if (!key) goto slow;
    if (PyList_Append(finals, weight) < 0) {
        Py_DECREF(key);
        return NULL;
    }
    PyList_SetItem(handed, layer_v, key); /* steals `key` */
    Py_RETURN_NONE;
slow:
    return fallback(W.py_final, self, args, nargs, kwnames);
}

/* ---- the records of what was handed in ----------------------------------------------------------- */

/* slot_records(objects, cls, names): the named slots of each object (all of class `cls`) as tuples.
 * A tuple of ints is untracked by the cycle collector, as CPython does on its first pass over one: a
 * step's records are tens of thousands of tuples, and the first collection after the step would
 * otherwise visit each. */
static PyObject *slot_records(PyObject *module, PyObject *args) {
    PyObject *objects, *cls, *names;
    if (!PyArg_ParseTuple(args, "O!O!O!:slot_records", &PyList_Type, &objects, &PyType_Type, &cls, &PyTuple_Type,
                          &names))
        return NULL;
    Py_ssize_t width = PyTuple_GET_SIZE(names), count = PyList_GET_SIZE(objects);
    Py_ssize_t offsets[16];
    if (width > 16) return PyErr_Format(PyExc_ValueError, "slot_records: at most 16 names, got %zd", width);
    for (Py_ssize_t i = 0; i < width; i++) {
        const char *name = PyUnicode_Check(PyTuple_GET_ITEM(names, i)) ? PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i))
                                                                         : NULL;
        if (!name) return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "slot_records: names are strings");
        if (slot_offset(cls, name, &offsets[i]) < 0) return NULL;
    }
    PyObject *out = PyList_New(count);
    if (!out) return NULL;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *obj = PyList_GET_ITEM(objects, k);
        if (Py_TYPE(obj) != (PyTypeObject *)cls) {
            PyErr_Format(PyExc_TypeError, "slot_records: item %zd is a %s, not a %s", k, Py_TYPE(obj)->tp_name,
                         ((PyTypeObject *)cls)->tp_name);
            Py_DECREF(out);
            return NULL;
        }
        PyObject *record = PyTuple_New(width);
        if (!record) { Py_DECREF(out); return NULL; }
        int atoms = 1;
        for (Py_ssize_t i = 0; i < width; i++) {
            PyObject *value = SLOT(obj, offsets[i]);
            if (!value) {
                PyErr_Format(PyExc_AttributeError, "slot_records: item %zd has no %R", k, PyTuple_GET_ITEM(names, i));
                Py_DECREF(record);
                Py_DECREF(out);
                return NULL;
            }
            atoms &= PyLong_CheckExact(value);
            PyTuple_SET_ITEM(record, i, Py_NewRef(value));
        }
        if (atoms) PyObject_GC_UnTrack(record);
        PyList_SET_ITEM(out, k, record);
    }
    return out;
}

/* ---- install ------------------------------------------------------------------------------------- */

static PyMethodDef load_def = {"load_weights", (PyCFunction)(void (*)(void))fast_load_weights,
                               METH_FASTCALL | METH_KEYWORDS, NULL};
static PyMethodDef update_def = {"update", (PyCFunction)(void (*)(void))fast_update, METH_FASTCALL | METH_KEYWORDS,
                                 NULL};
static PyMethodDef final_def = {"set_final_weight", (PyCFunction)(void (*)(void))fast_set_final_weight,
                                METH_FASTCALL | METH_KEYWORDS, NULL};

static PyObject *install_weight_ops(PyObject *module, PyObject *args) {
    PyObject *Model, *RankState, *MemoryTracker, *Weight, *OptState, *WeightGrad, *docs;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!:install_weight_ops", &PyType_Type, &Model, &PyType_Type,
                          &RankState, &PyType_Type, &MemoryTracker, &PyType_Type, &Weight, &PyType_Type, &OptState,
                          &PyType_Type, &WeightGrad, &PyDict_Type, &docs))
        return NULL;
    struct { PyObject *cls; const char *name; Py_ssize_t *out; } slots[] = {
        {Model, "_state", &W.m_state}, {Model, "_mem", &W.m_mem}, {Model, "_events", &W.m_events},
        {Model, "_cache", &W.m_cache}, {Model, "rank", &W.m_rank}, {Model, "num_layers", &W.m_num_layers},
        {Model, "_shard_sizes", &W.m_shard_sizes}, {Model, "_full_batch", &W.m_full_batch},
        {RankState, "clock", &W.s_clock}, {RankState, "updated", &W.s_updated}, {RankState, "handed", &W.s_handed},
        {RankState, "final_weights", &W.s_final_weights}, {RankState, "loaded", &W.s_loaded}, {MemoryTracker, "context", &W.mem_context},
        {Weight, "rank", &W.rank}, {Weight, "layer", &W.layer}, {Weight, "step", &W.step},
        {Weight, "shards", &W.shards}, {Weight, "num_shards", &W.num_shards}, {Weight, "tp_rank", &W.tp_rank},
        {Weight, "tp_size", &W.tp_size}, {Weight, "samples", &W.samples},
    };
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++)
        if (slot_offset(slots[i].cls, slots[i].name, slots[i].out) < 0) return NULL;
    const char *shared[] = {"rank", "layer", "shards", "num_shards", "tp_rank", "tp_size", "samples"};
    Py_ssize_t want[] = {W.rank, W.layer, W.shards, W.num_shards, W.tp_rank, W.tp_size, W.samples};
    PyObject *siblings[] = {OptState, WeightGrad};
    if (same_layout(siblings, 2, shared, want, 7) < 0) return NULL;
    PyObject *given[] = {Weight, OptState, WeightGrad};
    PyTypeObject **types[] = {&W.Weight, &W.OptState, &W.WeightGrad};
    for (int i = 0; i < 3; i++) Py_XSETREF(*types[i], (PyTypeObject *)Py_NewRef(given[i]));
    Py_XSETREF(W.docs, Py_NewRef(docs));
    if (replace_method(Model, &load_def, &W.py_load, W.docs) < 0 ||
        replace_method(Model, &update_def, &W.py_update, W.docs) < 0 ||
        replace_method(Model, &final_def, &W.py_final, W.docs) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef weight_ops_methods[] = {
    {"install_weight_ops", install_weight_ops, METH_VARARGS,
     "install_weight_ops(Model, RankState, MemoryTracker, Weight, OptState, WeightGrad, docs): put the C "
     "load_weights, update and set_final_weight on Model; the Python methods stay their fallback."},
    {"slot_records", slot_records, METH_VARARGS,
     "slot_records(objects, cls, names): the named slots of each object of class `cls`, as tuples (those of "
     "ints untracked by the cycle collector)."},
    {NULL}};

int weight_ops_init(PyObject *module) {
    struct { PyObject **out; const char *text; } strings[] = {
        {&W.s_load, "load_weights"}, {&W.s_update, "update"}, {&W.s_compute, "compute"}, {&W.s_empty, ""},
        {&W.s_shard, "shard"}, {&W.s_num_shards, "num_shards"}, {&W.s_tp_rank, "tp_rank"},
        {&W.s_tp_size, "tp_size"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof strings[0]; i++)
        if (!(*strings[i].out = PyUnicode_InternFromString(strings[i].text))) return -1;
    if (!(W.zero = PyLong_FromLong(0)) || !(W.one = PyLong_FromLong(1)) || !(W.zero_float = PyFloat_FromDouble(0.0)))
        return -1;
    return PyModule_AddFunctions(module, weight_ops_methods);
}
