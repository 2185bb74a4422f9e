/* `EventLog.pack` in C: the recent event tuples into the log's columns and its table of event kinds.
 *
 * `engine/eventlog.py` is the specification. A kind is the fields that repeat across ranks (op, stream, layer,
 * bytes, FLOPs, peers, detail); `KindIndex` finds a kind's code by value, and peers by identity, as the
 * Python dict keyed by (..., id(peers)) does. Rows of new kinds go to the same table lists the Python
 * path appends to, so the two can take turns. An event with a field of an unexpected type makes
 * `pack_events` return False with nothing appended to the columns; Python then packs the batch.
 */
#include "_common.h"

typedef struct {
    PyObject *op, *stream, *detail, *peers; /* strong references; op == NULL marks an empty slot */
    long long layer, nbytes;
    double flops;
    Py_hash_t hash;
    uint32_t code;
} Kind;

typedef struct {
    PyObject_HEAD
    Kind *slots; /* open addressing, at most half full */
    Py_ssize_t cap, used;
} KindIndex;


static void KindIndex_dealloc(KindIndex *self) {
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        Kind *k = &self->slots[i];
        if (k->op) {
            Py_DECREF(k->op);
            Py_DECREF(k->stream);
            Py_DECREF(k->detail);
            Py_DECREF(k->peers);
        }
    }
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t KindIndex_len(KindIndex *self) { return self->used; }

static PySequenceMethods KindIndex_as_sequence = {.sq_length = (lenfunc)KindIndex_len};

PyTypeObject KindIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_lib._buffers.KindIndex",
    .tp_doc = "KindIndex(): codes of event kinds by value (peers by identity), for `pack_events`.",
    .tp_basicsize = sizeof(KindIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)KindIndex_dealloc,
    .tp_as_sequence = &KindIndex_as_sequence,
};

static inline int same_str(PyObject *a, PyObject *b) {
    return a == b || PyUnicode_Compare(a, b) == 0; /* both exact str: Compare cannot fail */
}

static inline Py_hash_t mix(Py_hash_t h, unsigned long long v) {
    unsigned long long x = ((unsigned long long)h ^ v) * 0x9E3779B97F4A7C15ULL;
    return (Py_hash_t)(x ^ x >> 29);
}

static int index_grow(KindIndex *self) {
    Py_ssize_t cap = self->cap ? self->cap * 2 : 64;
    Kind *slots = PyMem_Calloc(cap, sizeof(Kind));
    if (!slots) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        Kind *k = &self->slots[i];
        if (!k->op) continue;
        Py_ssize_t j = (size_t)k->hash & (cap - 1);
        while (slots[j].op) j = (j + 1) & (cap - 1);
        slots[j] = *k;
    }
    PyMem_Free(self->slots);
    self->slots = slots;
    self->cap = cap;
    return 0;
}

/* The code of this event's kind, adding a row to `table` (seven lists) for a new one; -1 on error. */
static long kind_code(KindIndex *self, PyObject *table, PyObject *const *e, long long layer, long long nbytes,
                      double flops) {
    PyObject *op = e[1], *stream = e[2], *peers = e[9], *detail = e[11];
    Py_hash_t h_op = PyObject_Hash(op), h_stream = PyObject_Hash(stream), h_detail = PyObject_Hash(detail);
    if (h_op == -1 || h_stream == -1 || h_detail == -1) return -1;
    unsigned long long flop_bits;
    memcpy(&flop_bits, &flops, sizeof flop_bits);
    unsigned long long parts[] = {(unsigned long long)h_stream, (unsigned long long)h_detail, (uintptr_t)peers,
                                  (unsigned long long)layer, (unsigned long long)nbytes, flop_bits};
    Py_hash_t h = h_op;
    for (int i = 0; i < 6; i++) h = mix(h, parts[i]);
    if (self->used * 2 >= self->cap && index_grow(self) < 0) return -1;
    Py_ssize_t i = (size_t)h & (self->cap - 1);
    for (;; i = (i + 1) & (self->cap - 1)) {
        Kind *k = &self->slots[i];
        if (!k->op) break;
        if (k->hash == h && k->peers == peers && k->layer == layer && k->nbytes == nbytes && k->flops == flops &&
            same_str(k->op, op) && same_str(k->stream, stream) && same_str(k->detail, detail))
            return k->code;
    }
    /* a new kind: its row, in the table's column order (op, stream, layer, nbytes, flops, peers, detail) */
    Py_ssize_t code = PyList_GET_SIZE(PyTuple_GET_ITEM(table, 0));
    if (code > UINT32_MAX) { PyErr_SetString(PyExc_OverflowError, "too many kinds of events"); return -1; }
    PyObject *row[7] = {op, stream, e[5], e[7], e[8], peers, detail};
    for (int c = 0; c < 7; c++)
        if (PyList_Append(PyTuple_GET_ITEM(table, c), row[c]) < 0) return -1;
    Kind *k = &self->slots[i];
    *k = (Kind){Py_NewRef(op), Py_NewRef(stream), Py_NewRef(detail), Py_NewRef(peers), layer, nbytes, flops, h,
                (uint32_t)code};
    self->used++;
    return (long)code;
}

static inline int as_int32(PyObject *x, int32_t *out) {
    if (!PyLong_CheckExact(x)) return 0;
    int overflow;
    long v = PyLong_AsLongAndOverflow(x, &overflow);
    if (overflow || v < INT32_MIN || v > INT32_MAX) return 0;
    *out = (int32_t)v;
    return 1;
}

static inline int as_int64(PyObject *x, long long *out) {
    if (!PyLong_CheckExact(x)) return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(x, &overflow);
    return !overflow;
}

static inline int as_double(PyObject *x, double *out) {
    if (PyFloat_CheckExact(x)) { *out = PyFloat_AS_DOUBLE(x); return 1; }
    return 0;
}

/* column.frombytes(the first n items of buf) */
static int extend_column(PyObject *column, const void *buf, Py_ssize_t nbytes) {
    PyObject *bytes = PyBytes_FromStringAndSize(buf, nbytes);
    if (!bytes) return -1;
    PyObject *r = PyObject_CallMethodOneArg(column, str_frombytes, bytes);
    Py_DECREF(bytes);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

PyObject *pack_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_CheckExact(args[0]) || Py_TYPE(args[1]) != &KindIndexType ||
        !PyTuple_CheckExact(args[2]) || PyTuple_GET_SIZE(args[2]) != 7 || !PyList_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "pack_events(recent, index, table, rank, kind, start, end, samples, op_id)");
        return NULL;
    }
    PyObject *recent = args[0], *table = args[2], *samples = args[7];
    KindIndex *index = (KindIndex *)args[1];
    for (int c = 0; c < 7; c++)
        if (!PyList_CheckExact(PyTuple_GET_ITEM(table, c))) {
            PyErr_SetString(PyExc_TypeError, "pack_events: the kind table is a tuple of seven lists");
            return NULL;
        }
    Py_ssize_t n = PyList_GET_SIZE(recent);
    if (!n) Py_RETURN_TRUE;
    /* one block: ranks, kinds and op ids (4 bytes each), starts and ends (8 bytes each) */
    char *block = PyMem_Malloc((size_t)n * 28);
    if (!block) return PyErr_NoMemory();
    double *starts = (double *)block, *ends = starts + n;
    int32_t *ranks = (int32_t *)(ends + n), *op_ids = ranks + n;
    uint32_t *kinds = (uint32_t *)(op_ids + n);
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *event = PyList_GET_ITEM(recent, i);
        if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 12) goto off;
        PyObject *const *e = &PyTuple_GET_ITEM(event, 0);
        long long layer, nbytes;
        double flops;
        if (!as_int32(e[0], &ranks[i]) || !as_double(e[3], &starts[i]) || !as_double(e[4], &ends[i]) ||
            !as_int64(e[5], &layer) || !as_int64(e[7], &nbytes) || !as_double(e[8], &flops) ||
            !as_int32(e[10], &op_ids[i]) || !PyUnicode_CheckExact(e[1]) || !PyUnicode_CheckExact(e[2]) ||
            !PyUnicode_CheckExact(e[11]) || layer < INT32_MIN || layer > INT32_MAX) {
            PyErr_Clear();
            goto off;
        }
        long code = kind_code(index, table, e, layer, nbytes, flops);
        if (code < 0) goto done;
        kinds[i] = (uint32_t)code;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyList_Append(samples, PyTuple_GET_ITEM(PyList_GET_ITEM(recent, i), 6)) < 0) goto done;
    if (extend_column(args[3], ranks, n * 4) < 0 || extend_column(args[4], kinds, n * 4) < 0 ||
        extend_column(args[5], starts, n * 8) < 0 || extend_column(args[6], ends, n * 8) < 0 ||
        extend_column(args[8], op_ids, n * 4) < 0 || PyList_SetSlice(recent, 0, n, NULL) < 0)
        goto done;
    result = Py_NewRef(Py_True);
    goto done;
off:
    result = Py_NewRef(Py_False);
done:
    PyMem_Free(block);
    return result;
}
