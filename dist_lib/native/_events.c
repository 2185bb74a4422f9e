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
    /* the staged rows (see above): `staged` of them, room for `staged_cap`; `recent` is the log's list of
       tuples (a strong reference), `table` its kind table (the tuple of seven lists), once known */
    PyObject *recent, *table;
    PyObject *codes; /* the log's dict of kind codes (`EventLog._kind_codes`, held), or NULL */
    Py_ssize_t staged, staged_cap;
    int32_t *ranks, *op_ids;
    uint32_t *kinds;
    double *starts, *ends;
    PyObject **samples; /* strong references */
} KindIndex;

/* The logs that stage, by their `recent` list: a few at once (a step's, and those of steps still held). */
#define STAGING_LOGS 16
static KindIndex *staging[STAGING_LOGS];


static void unstage(KindIndex *self) {
    for (int i = 0; i < STAGING_LOGS; i++)
        if (staging[i] == self) staging[i] = NULL;
    for (Py_ssize_t i = 0; i < self->staged; i++) Py_DECREF(self->samples[i]);
    self->staged = 0;
}

static void KindIndex_dealloc(KindIndex *self) {
    unstage(self);
    Py_CLEAR(self->recent);
    Py_CLEAR(self->table);
    Py_CLEAR(self->codes);
    PyMem_Free(self->ranks);
    PyMem_Free(self->op_ids);
    PyMem_Free(self->kinds);
    PyMem_Free(self->starts);
    PyMem_Free(self->ends);
    PyMem_Free(self->samples);
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

/* KindIndex(recent=None, table=None, codes=None): with the log's list of recent tuples and its kind table (a tuple
 * of seven lists), the C ops stage that log's events; with the log's dict of kind codes, every kind is coded as
 * that dict codes it (see `kind_code`). */
static int KindIndex_init(KindIndex *self, PyObject *args, PyObject *kwds) {
    PyObject *recent = Py_None, *table = Py_None, *codes = Py_None;
    static char *names[] = {"recent", "table", "codes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOO:KindIndex", names, &recent, &table, &codes)) return -1;
    if (codes != Py_None) {
        if (!PyDict_CheckExact(codes)) {
            PyErr_SetString(PyExc_TypeError, "KindIndex(codes=...): the log's dict of kind codes");
            return -1;
        }
        Py_XSETREF(self->codes, Py_NewRef(codes));
    }
    if (recent == Py_None || self->recent) return 0;
    int lists = PyTuple_CheckExact(table) && PyTuple_GET_SIZE(table) == 7;
    for (int c = 0; lists && c < 7; c++) lists = PyList_CheckExact(PyTuple_GET_ITEM(table, c));
    if (!PyList_CheckExact(recent) || !lists) {
        PyErr_SetString(PyExc_TypeError,
                        "KindIndex(recent, table): the log's list of recent event tuples and its seven kind lists");
        return -1;
    }
    Py_XSETREF(self->table, Py_NewRef(table));
    for (int i = 0; i < STAGING_LOGS; i++)
        if (!staging[i]) { /* (with every place taken, this log's events go to `recent` as tuples) */
            staging[i] = self;
            self->recent = Py_NewRef(recent);
            break;
        }
    return 0;
}

static PyMemberDef KindIndex_members[] = {
    {"staged", T_PYSSIZET, offsetof(KindIndex, staged), READONLY, "events staged, not yet in the columns"},
    {NULL}};

static PySequenceMethods KindIndex_as_sequence = {.sq_length = (lenfunc)KindIndex_len};

PyTypeObject KindIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_lib._buffers.KindIndex",
    .tp_doc = "KindIndex(recent=None, table=None): codes of event kinds by value (peers by identity), for "
              "`pack_events`; with the log's list of recent tuples and its kind table, the C ops stage that log's "
              "events as rows of its columns.",
    .tp_basicsize = sizeof(KindIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KindIndex_init,
    .tp_dealloc = (destructor)KindIndex_dealloc,
    .tp_members = KindIndex_members,
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

/* An exact str's hash: the one it keeps once computed, else PyObject_Hash. */
static inline Py_hash_t str_hash(PyObject *s) {
    Py_hash_t h = ((PyASCIIObject *)s)->hash;
    return h != -1 ? h : PyObject_Hash(s);
}

/* The code of this event's kind, adding a row to `table` (seven lists) for a new one; -1 on error. */
static long kind_code(KindIndex *self, PyObject *table, PyObject *const *e, long long layer, long long nbytes,
                      double flops) {
    PyObject *op = e[1], *stream = e[2], *peers = e[9], *detail = e[11];
    Py_hash_t h_op = str_hash(op), h_stream = str_hash(stream), h_detail = str_hash(detail);
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
    /* A kind this index has not seen. The log's dict of codes (the Python packing's index, keyed by
       (op, stream, layer, nbytes, flops, detail, id(peers))) is the one record of which kinds have rows: a kind
       it has takes that code, a new one gets a row and goes into it too. So the table is the one packing
       every event in Python makes, whichever packed what (a key equal in value but not in type, a layer True
       beside 1, shares the row of whichever came first, as in the dict). */
    Py_ssize_t code = PyList_GET_SIZE(PyTuple_GET_ITEM(table, 0));
    PyObject *key = NULL;
    if (self->codes) {
        PyObject *id = PyLong_FromVoidPtr(peers);
        key = id ? PyTuple_Pack(7, op, stream, e[5], e[7], e[8], detail, id) : NULL;
        Py_XDECREF(id);
        PyObject *known = key ? PyDict_GetItemWithError(self->codes, key) : NULL;
        if (!key || (!known && PyErr_Occurred())) { Py_XDECREF(key); return -1; }
        if (known) {
            Py_DECREF(key);
            key = NULL;
            code = PyLong_AsSsize_t(known);
            if (code < 0) return -1;
        }
    }
    if (code > UINT32_MAX) { Py_XDECREF(key); PyErr_SetString(PyExc_OverflowError, "too many kinds of events"); return -1; }
    if (code == PyList_GET_SIZE(PyTuple_GET_ITEM(table, 0))) { /* a new row, in the table's column order */
        PyObject *row[7] = {op, stream, e[5], e[7], e[8], peers, detail};
        for (int c = 0; c < 7; c++)
            if (PyList_Append(PyTuple_GET_ITEM(table, c), row[c]) < 0) { Py_XDECREF(key); return -1; }
        if (key) {
            PyObject *value = PyLong_FromSsize_t(code);
            int failed = !value || PyDict_SetItem(self->codes, key, value) < 0;
            Py_XDECREF(value);
            Py_DECREF(key);
            if (failed) return -1;
        }
    }
    Kind *k = &self->slots[i];
    *k = (Kind){Py_NewRef(op), Py_NewRef(stream), Py_NewRef(detail), Py_NewRef(peers), layer, nbytes, flops, h,
                (uint32_t)code};
    self->used++;
    return (long)code;
}

/* (An exact int of up to two digits is read from its digits: `long_long_of`.) */
static inline int as_int32(PyObject *x, int32_t *out) {
    if (!PyLong_CheckExact(x)) return 0;
#ifdef MASK_DIGITS
    if (MASK_NDIGITS(x) >= -2 && MASK_NDIGITS(x) <= 2) {
        long long v = long_long_of(x);
        if (v < INT32_MIN || v > INT32_MAX) return 0;
        *out = (int32_t)v;
        return 1;
    }
#endif
    int overflow;
    long v = PyLong_AsLongAndOverflow(x, &overflow);
    if (overflow || v < INT32_MIN || v > INT32_MAX) return 0;
    *out = (int32_t)v;
    return 1;
}

static inline int as_int64(PyObject *x, long long *out) {
    if (!PyLong_CheckExact(x)) return 0;
#ifdef MASK_DIGITS
    if (MASK_NDIGITS(x) >= -2 && MASK_NDIGITS(x) <= 2) {
        *out = long_long_of(x);
        return 1;
    }
#endif
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(x, &overflow);
    return !overflow;
}

static inline int as_double(PyObject *x, double *out) {
    if (PyFloat_CheckExact(x)) { *out = PyFloat_AS_DOUBLE(x); return 1; }
    return 0;
}

/* The staging log whose recent tuples are `recent`, or NULL. */
static KindIndex *staging_of(PyObject *recent) {
    static int last;
    if (staging[last] && staging[last]->recent == recent) return staging[last];
    for (int i = 0; i < STAGING_LOGS; i++)
        if (staging[i] && staging[i]->recent == recent) {
            last = i;
            return staging[i];
        }
    return NULL;
}

Py_ssize_t pending_events(PyObject *recent) {
    KindIndex *index = staging_of(recent);
    return PyList_GET_SIZE(recent) + (index ? index->staged : 0);
}

static int stage_grow(KindIndex *self) {
    Py_ssize_t cap = self->staged_cap ? self->staged_cap * 2 : 1024;
    int32_t *ranks = PyMem_Realloc(self->ranks, cap * sizeof(int32_t));
    if (ranks) self->ranks = ranks;
    int32_t *op_ids = ranks ? PyMem_Realloc(self->op_ids, cap * sizeof(int32_t)) : NULL;
    if (op_ids) self->op_ids = op_ids;
    uint32_t *kinds = op_ids ? PyMem_Realloc(self->kinds, cap * sizeof(uint32_t)) : NULL;
    if (kinds) self->kinds = kinds;
    double *starts = kinds ? PyMem_Realloc(self->starts, cap * sizeof(double)) : NULL;
    if (starts) self->starts = starts;
    double *ends = starts ? PyMem_Realloc(self->ends, cap * sizeof(double)) : NULL;
    if (ends) self->ends = ends;
    PyObject **samples = ends ? PyMem_Realloc(self->samples, cap * sizeof(PyObject *)) : NULL;
    if (!samples) { PyErr_NoMemory(); return -1; }
    self->samples = samples;
    self->staged_cap = cap;
    return 0;
}

/* Stage the row of the event with these 12 fields: 1; 0 (nothing staged) when a field is not what a row
 * holds; -1 with an exception. */
static int stage_row(KindIndex *index, PyObject *const *e) {
    int32_t rank, op_id;
    long long layer, nbytes;
    double start, end, flops;
    if (!as_int32(e[0], &rank) || !as_double(e[3], &start) || !as_double(e[4], &end) || !as_int64(e[5], &layer) ||
        !as_int64(e[7], &nbytes) || !as_double(e[8], &flops) || !as_int32(e[10], &op_id) ||
        !PyUnicode_CheckExact(e[1]) || !PyUnicode_CheckExact(e[2]) || !PyUnicode_CheckExact(e[11]) ||
        layer < INT32_MIN || layer > INT32_MAX) {
        PyErr_Clear();
        return 0;
    }
    if (index->staged == index->staged_cap && stage_grow(index) < 0) return -1;
    long code = kind_code(index, index->table, e, layer, nbytes, flops);
    if (code < 0) return -1;
    Py_ssize_t i = index->staged++;
    index->ranks[i] = rank;
    index->kinds[i] = (uint32_t)code;
    index->starts[i] = start;
    index->ends[i] = end;
    index->op_ids[i] = op_id;
    index->samples[i] = Py_NewRef(e[6]);
    return 1;
}

/* The event's row, staged: 1; 0 when it goes to `recent` as a tuple instead (the log stages nothing, a field
 * is not what a row holds, or a tuple in `recent` is not what a row holds); -1 with an exception. Tuples in
 * `recent` (events the Python recorded) are staged first, in order, so that the rows stay before them. */
static int stage_event(PyObject *recent, PyObject *const *e) {
    KindIndex *index = staging_of(recent);
    if (!index || !index->table) return 0;
    Py_ssize_t n = PyList_GET_SIZE(recent), taken = 0;
    int ok = 1;
    while (taken < n) {
        PyObject *event = PyList_GET_ITEM(recent, taken);
        ok = PyTuple_CheckExact(event) && PyTuple_GET_SIZE(event) == 12 ? stage_row(index, &PyTuple_GET_ITEM(event, 0)) : 0;
        if (ok <= 0) break;
        taken++;
    }
    if (taken && PyList_SetSlice(recent, 0, taken, NULL) < 0) return -1;
    if (ok <= 0) return ok;
    return stage_row(index, e);
}

int append_event(PyObject *events, PyObject *const *fields) {
    int staged = stage_event(events, fields);
    if (staged) return staged < 0 ? -1 : 0;
    PyObject *event = PyTuple_New(12);
    if (!event) return -1;
    for (int i = 0; i < 12; i++) PyTuple_SET_ITEM(event, i, Py_NewRef(fields[i]));
    int failed = PyList_Append(events, event);
    Py_DECREF(event);
    return failed;
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
    if (index->table != table) Py_XSETREF(index->table, Py_NewRef(table)); /* staged rows' kinds go here */
    /* the staged rows first: they came before every tuple of `recent` */
    Py_ssize_t k = index->staged;
    if (k) {
        if (extend_column(args[3], index->ranks, k * 4) < 0 || extend_column(args[4], index->kinds, k * 4) < 0 ||
            extend_column(args[5], index->starts, k * 8) < 0 || extend_column(args[6], index->ends, k * 8) < 0 ||
            extend_column(args[8], index->op_ids, k * 4) < 0)
            return NULL;
        for (Py_ssize_t i = 0; i < k; i++) {
            int failed = PyList_Append(samples, index->samples[i]);
            Py_DECREF(index->samples[i]);
            if (failed) { /* (the rest are dropped with it: the log is broken either way) */
                for (Py_ssize_t j = i + 1; j < k; j++) Py_DECREF(index->samples[j]);
                index->staged = 0;
                return NULL;
            }
        }
        index->staged = 0;
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
