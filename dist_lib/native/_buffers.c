/* Buffers and their allocation log in C: the simulator's hottest path.
 *
 * Every symbolic tensor is a Buffer. Creating one on a rank's AllocLog appends (time, +bytes, tag) to
 * the log; when CPython frees the last reference, the deallocator appends (time, -bytes, tag). An
 * entry is 8 bytes: the buffer's address with the number of its (bytes, kind) shape on that rank (a
 * rank uses few distinct shapes); times are kept once per run of entries logged at the same time (an op
 * allocates and frees several buffers at one instant). `arrays()` decodes them. A view
 * shares another tensor's buffer (an in-place all-reduce, an accumulated gradient): it keeps the owner
 * alive and logs nothing itself. `memory/buffers.py` is the pure-Python twin with the same semantics; its
 * docstrings are the specification, and `memory/tracker.py` takes this module when it was built.
 */
#include "_common.h"

PyTypeObject AllocLogType;
PyTypeObject BufferType;

/* What a Buffer subclass's constructor needs, looked up once per class: its kind code, and the slots
 * that `_args` names with their offsets, so the fields are stored without running Python code. */
#define MAX_ARGS 16
#define MAX_TYPES 256
typedef struct {
    PyTypeObject *type; /* a strong reference: a cached class is never freed */
    long code;          /* -1: the class has none (it can only make views) */
    Py_ssize_t nargs;   /* -1: no `_args`, the class's own __init__ takes the fields */
    Py_ssize_t nrequired;
    Py_ssize_t offsets[MAX_ARGS];
    PyObject *defaults; /* values of the trailing args a call may leave out */
} TypeInfo;
static TypeInfo type_cache[MAX_TYPES];
static int type_cache_len;

/* ---- the log ------------------------------------------------------------------------------------ */

static int log_grow(AllocLog *log) {
    Py_ssize_t cap = log->cap + (log->cap >> 3) + 16; /* as CPython grows a list: little slack per rank */
    if (cap > UINT32_MAX) { PyErr_SetString(PyExc_OverflowError, "more than 2**32 log entries on one rank"); return -1; }
    uint64_t *entries = PyMem_Realloc(log->entries, cap * sizeof(uint64_t));
    if (!entries) { PyErr_NoMemory(); return -1; }
    log->entries = entries;
    log->cap = cap;
    return 0;
}

static int runs_grow(AllocLog *log) {
    Py_ssize_t cap = log->runs_cap + (log->runs_cap >> 3) + 8;
    double *times = PyMem_Realloc(log->run_time, cap * sizeof(double));
    if (!times) { PyErr_NoMemory(); return -1; }
    log->run_time = times;
    uint32_t *firsts = PyMem_Realloc(log->run_first, cap * sizeof(uint32_t));
    if (!firsts) { PyErr_NoMemory(); return -1; }
    log->run_first = firsts;
    log->runs_cap = cap;
    return 0;
}

static inline size_t shape_slot(unsigned long long key, Py_ssize_t index_cap) {
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & (size_t)(index_cap - 1); /* Fibonacci hashing */
}

static int index_insert(AllocLog *log, Py_ssize_t shape) {
    unsigned long long key = (unsigned long long)log->shape_bytes[shape] << 3 | log->shape_code[shape];
    for (size_t i = shape_slot(key, log->index_cap);; i = (i + 1) & (size_t)(log->index_cap - 1))
        if (log->index[i] < 0) { log->index[i] = (int32_t)shape; return 0; }
}

/* The number of the shape (nbytes, code) on this log, numbering it if new; -1 with an exception set. */
static long long log_shape(AllocLog *log, long long nbytes, long code) {
    unsigned long long key = (unsigned long long)nbytes << 3 | (unsigned long long)code;
    if (log->index_cap) {
        for (size_t i = shape_slot(key, log->index_cap);; i = (i + 1) & (size_t)(log->index_cap - 1)) {
            int32_t shape = log->index[i];
            if (shape < 0) break;
            if (log->shape_bytes[shape] == nbytes && log->shape_code[shape] == code) return shape;
        }
    }
    if ((unsigned long long)log->nshapes > SHAPE_MASK) {
        PyErr_Format(PyExc_RuntimeError, "more than %llu distinct tensor sizes on one rank", SHAPE_MASK + 1);
        return -1;
    }
    if (log->nshapes == log->shapes_cap) {
        Py_ssize_t cap = log->shapes_cap * 2 + 8;
        long long *bytes = PyMem_Realloc(log->shape_bytes, cap * sizeof(long long));
        if (!bytes) { PyErr_NoMemory(); return -1; }
        log->shape_bytes = bytes;
        unsigned char *codes = PyMem_Realloc(log->shape_code, cap);
        if (!codes) { PyErr_NoMemory(); return -1; }
        log->shape_code = codes;
        log->shapes_cap = cap;
    }
    Py_ssize_t shape = log->nshapes++;
    log->shape_bytes[shape] = nbytes;
    log->shape_code[shape] = (unsigned char)code;
    if (log->nshapes * 2 > log->index_cap) { /* keep the index at most half full */
        Py_ssize_t cap = log->index_cap ? log->index_cap * 2 : 16;
        int32_t *index = PyMem_Malloc(cap * sizeof(int32_t));
        if (!index) { log->nshapes--; PyErr_NoMemory(); return -1; }
        memset(index, 0xff, cap * sizeof(int32_t));
        PyMem_Free(log->index);
        log->index = index;
        log->index_cap = cap;
        for (Py_ssize_t i = 0; i < log->nshapes; i++) index_insert(log, i);
    } else {
        index_insert(log, shape);
    }
    return shape;
}

static PyTypeObject *clock_type; /* owners whose clock is read from a slot, not looked up */
static Py_ssize_t clock_offset;

void set_clock_slot(PyTypeObject *type, Py_ssize_t offset) {
    Py_INCREF(type);
    Py_XSETREF(clock_type, type);
    clock_offset = offset;
}

double log_clock(AllocLog *log) {
    PyObject *owner = log->owner;
    if (!owner) return 0.0;
    if (Py_TYPE(owner) == clock_type) {
        PyObject *clock = *(PyObject **)((char *)owner + clock_offset);
        if (clock && PyFloat_CheckExact(clock)) return PyFloat_AS_DOUBLE(clock);
    }
    PyObject *clock = PyObject_GetAttr(owner, str_clock);
    if (!clock) return -1.0;
    double t = PyFloat_AsDouble(clock);
    Py_DECREF(clock);
    return t;
}

static int log_append(AllocLog *log, double time, uint64_t packed, long long delta) {
    if (log->len == log->cap && log_grow(log) < 0) return -1;
    if (!log->nruns || log->run_time[log->nruns - 1] != time) { /* the time moved: a new run */
        if (log->nruns == log->runs_cap && runs_grow(log) < 0) return -1;
        log->run_time[log->nruns] = time;
        log->run_first[log->nruns++] = (uint32_t)log->len;
    }
    log->entries[log->len++] = packed;
    log->live += delta;
    return 0;
}

/* The entry a buffer's allocation logs (its free adds FREE). */
static inline uint64_t buffer_entry(Buffer *self) {
    return (uint64_t)(uintptr_t)self >> 4 << ADDRESS_SHIFT | BUFFER_SHAPE(self);
}

static void log_free_entries(AllocLog *log) {
    PyMem_Free(log->entries);
    PyMem_Free(log->run_time);
    PyMem_Free(log->run_first);
    log->entries = NULL;
    log->run_time = NULL;
    log->run_first = NULL;
    log->len = log->cap = log->nruns = log->runs_cap = 0;
}

/* array.array(typecode) holding a copy of n items of `size` bytes at `data`. */
static PyObject *to_array(const char *typecode, void *data, Py_ssize_t n, Py_ssize_t size) {
    PyObject *out = PyObject_CallFunction(array_type, "s", typecode);
    if (!out || n == 0) return out;
    PyObject *view = PyMemoryView_FromMemory((char *)data, n * size, PyBUF_READ);
    if (!view) { Py_DECREF(out); return NULL; }
    PyObject *r = PyObject_CallMethodOneArg(out, str_frombytes, view);
    Py_DECREF(view);
    if (!r) { Py_DECREF(out); return NULL; }
    Py_DECREF(r);
    return out;
}

/* (times, signed bytes, tags: buffer address | kind code), decoded from the entries. */
static PyObject *log_arrays(AllocLog *log) {
    Py_ssize_t n = log->len;
    double *times = PyMem_Malloc((n ? n : 1) * sizeof(double));
    long long *deltas = PyMem_Malloc((n ? n : 1) * sizeof(long long));
    long long *tags = PyMem_Malloc((n ? n : 1) * sizeof(long long));
    PyObject *out = NULL;
    if (!times || !deltas || !tags) { PyErr_NoMemory(); goto done; }
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t e = log->entries[i];
        Py_ssize_t shape = (Py_ssize_t)(e & SHAPE_MASK);
        while (run + 1 < log->nruns && log->run_first[run + 1] <= i) run++;
        times[i] = log->run_time[run];
        deltas[i] = e & FREE ? -log->shape_bytes[shape] : log->shape_bytes[shape];
        tags[i] = (long long)(e >> ADDRESS_SHIFT << 4) | log->shape_code[shape];
    }
    PyObject *t = to_array("d", times, n, sizeof(double));
    PyObject *d = t ? to_array("q", deltas, n, sizeof(long long)) : NULL;
    PyObject *g = d ? to_array("q", tags, n, sizeof(long long)) : NULL;
    if (!g) { Py_XDECREF(t); Py_XDECREF(d); goto done; }
    out = Py_BuildValue("(NNN)", t, d, g);
done:
    PyMem_Free(times);
    PyMem_Free(deltas);
    PyMem_Free(tags);
    return out;
}

static PyObject *AllocLog_arrays(AllocLog *self, PyObject *Py_UNUSED(ignored)) {
    return log_arrays(self);
}

/* (first entry of each time run, its time, packed entries, shape bytes, shape kind codes): the log as
 * stored, for `buffers.decode` and `buffers.expand_runs`. */
static PyObject *AllocLog_take(AllocLog *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *f = to_array("I", self->run_first, self->nruns, sizeof(uint32_t));
    PyObject *t = f ? to_array("d", self->run_time, self->nruns, sizeof(double)) : NULL;
    PyObject *p = t ? to_array("Q", self->entries, self->len, sizeof(uint64_t)) : NULL;
    PyObject *b = p ? to_array("q", self->shape_bytes, self->nshapes, sizeof(long long)) : NULL;
    PyObject *c = b ? to_array("B", self->shape_code, self->nshapes, 1) : NULL;
    if (!c) {
        Py_XDECREF(f); Py_XDECREF(t); Py_XDECREF(p); Py_XDECREF(b);
        return NULL;
    }
    log_free_entries(self); /* the shapes stay: live buffers refer to them */
    return Py_BuildValue("(NNNNN)", f, t, p, b, c);
}

static Py_ssize_t AllocLog_len(AllocLog *self) { return self->len; }

static int AllocLog_traverse(AllocLog *self, visitproc visit, void *arg) {
    Py_VISIT(self->owner);
    return 0;
}

static int AllocLog_clear(AllocLog *self) {
    Py_CLEAR(self->owner);
    return 0;
}

static void AllocLog_dealloc(AllocLog *self) {
    PyObject_GC_UnTrack(self);
    AllocLog_clear(self);
    log_free_entries(self);
    PyMem_Free(self->shape_bytes);
    PyMem_Free(self->shape_code);
    PyMem_Free(self->index);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef AllocLog_methods[] = {
    {"arrays", (PyCFunction)AllocLog_arrays, METH_NOARGS,
     "(times, signed bytes, tags) so far, as new arrays."},
    {"take", (PyCFunction)AllocLog_take, METH_NOARGS,
     "(first entry of each time run, its time, packed entries, shape bytes, shape kind codes) so far, "
     "as stored (`buffers.decode` reads them); the log starts empty again."},
    {NULL}};

static PyMemberDef AllocLog_members[] = {
    {"owner", T_OBJECT, offsetof(AllocLog, owner), 0, "whose `clock` stamps the log"},
    {"live", T_LONGLONG, offsetof(AllocLog, live), 0, "bytes live now"},
    {"peak", T_LONGLONG, offsetof(AllocLog, peak), READONLY, "most bytes live at once"},
    {"capacity", T_LONGLONG, offsetof(AllocLog, capacity), 0, "bytes the device holds"},
    {"peak_index", T_PYSSIZET, offsetof(AllocLog, peak_index), READONLY,
     "log entries up to and including the peak"},
    {"enforce", T_BOOL, offsetof(AllocLog, enforce), 0, "raise when live bytes exceed the capacity"},
    {NULL}};

static PySequenceMethods AllocLog_as_sequence = {.sq_length = (lenfunc)AllocLog_len};

PyTypeObject AllocLogType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_lib._buffers.AllocLog",
    .tp_doc = "One rank's live bytes, peak, and log of every allocation and free.",
    .tp_basicsize = sizeof(AllocLog),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)AllocLog_dealloc,
    .tp_traverse = (traverseproc)AllocLog_traverse,
    .tp_clear = (inquiry)AllocLog_clear,
    .tp_methods = AllocLog_methods,
    .tp_members = AllocLog_members,
    .tp_as_sequence = &AllocLog_as_sequence,
};

/* ---- buffers ------------------------------------------------------------------------------------- */

/* the cache's entries by the class's address: a class found once is found again without the scan */
#define TYPE_SLOTS 64 /* a power of two */
static TypeInfo *type_slots[TYPE_SLOTS];

static TypeInfo *type_info(PyTypeObject *type) {
    size_t slot = (size_t)((uintptr_t)type >> 4) & (TYPE_SLOTS - 1);
    if (type_slots[slot] && type_slots[slot]->type == type) return type_slots[slot];
    for (int i = 0; i < type_cache_len; i++)
        if (type_cache[i].type == type) return type_slots[slot] = &type_cache[i];
    if (type_cache_len == MAX_TYPES) {
        PyErr_SetString(PyExc_RuntimeError, "too many Buffer classes");
        return NULL;
    }
    TypeInfo info = {.type = type, .code = -1, .nargs = -1};
    PyObject *code = PyObject_GetAttr((PyObject *)type, str_code);
    if (code) {
        info.code = PyLong_AsLong(code);
        Py_DECREF(code);
        if (info.code == -1 && PyErr_Occurred()) return NULL;
    } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    } else {
        return NULL;
    }
    PyObject *args = PyObject_GetAttr((PyObject *)type, str_args);
    if (!args) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
        PyErr_Clear();
    } else {
        PyObject *defaults = PyObject_GetAttr((PyObject *)type, str_defaults);
        if (!defaults) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) { Py_DECREF(args); return NULL; }
            PyErr_Clear();
            defaults = PyTuple_New(0);
        }
        if (!PyTuple_Check(args) || !defaults || !PyTuple_Check(defaults) || PyTuple_GET_SIZE(args) > MAX_ARGS ||
            PyTuple_GET_SIZE(defaults) > PyTuple_GET_SIZE(args)) {
            PyErr_Format(PyExc_TypeError, "%s: _args and _defaults must be tuples, at most %d args",
                         type->tp_name, MAX_ARGS);
            Py_DECREF(args); Py_XDECREF(defaults);
            return NULL;
        }
        info.nargs = PyTuple_GET_SIZE(args);
        info.nrequired = info.nargs - PyTuple_GET_SIZE(defaults);
        info.defaults = defaults;
        for (Py_ssize_t i = 0; i < info.nargs; i++) {
            PyObject *descr = PyObject_GetAttr((PyObject *)type, PyTuple_GET_ITEM(args, i));
            if (!descr) { Py_DECREF(args); Py_DECREF(defaults); return NULL; }
            int is_slot = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                          ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
            if (is_slot) info.offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
            Py_DECREF(descr);
            if (!is_slot) {
                PyErr_Format(PyExc_TypeError, "%s: _args names %R, which is not a slot", type->tp_name,
                             PyTuple_GET_ITEM(args, i));
                Py_DECREF(args); Py_DECREF(defaults);
                return NULL;
            }
        }
        Py_DECREF(args);
    }
    Py_INCREF(type);
    type_cache[type_cache_len] = info;
    return type_slots[slot] = &type_cache[type_cache_len++];
}

static int check_arg_count(PyTypeObject *type, TypeInfo *info, Py_ssize_t given) {
    if (info->nargs >= 0 && (given < info->nrequired || given > info->nargs)) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd fields after the buffer and byte count, got %zd",
                     type->tp_name, info->nrequired, info->nargs, given);
        return -1;
    }
    return 0;
}

/* Store the constructor's fields (args after the buffer and byte count) in the slots `_args` names. */
static void store_args(PyObject *self, TypeInfo *info, PyObject *const *fields, Py_ssize_t given) {
    Py_ssize_t first_default = info->nargs - PyTuple_GET_SIZE(info->defaults);
    for (Py_ssize_t i = 0; i < info->nargs; i++) {
        PyObject *value = i < given ? fields[i] : PyTuple_GET_ITEM(info->defaults, i - first_default);
        PyObject **slot = (PyObject **)((char *)self + info->offsets[i]);
        Py_INCREF(value);
        Py_XSETREF(*slot, value);
    }
}

PyObject *buffer_alloc(PyTypeObject *type, AllocLog *log, long long nbytes, PyObject *const *fields, Py_ssize_t n) {
    TypeInfo *info = type_info(type);
    if (!info || check_arg_count(type, info, n) < 0) return NULL;
    if (nbytes < 0 || (unsigned long long)nbytes > NBYTES_MASK) {
        PyErr_Format(PyExc_ValueError, "%s(): a buffer of %lld bytes", type->tp_name, nbytes);
        return NULL;
    }
    long code = info->code;
    if (code < 0) {
        PyErr_Format(PyExc_TypeError, "%s has no kind `code`: it cannot allocate", type->tp_name);
        return NULL;
    }
    double now = log_clock(log);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    long long shape = log_shape(log, nbytes, code & KIND_MASK);
    if (shape < 0) return NULL;
    Buffer *self = (Buffer *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->word = (unsigned long long)nbytes | (unsigned long long)shape << SHAPE_SHIFT |
                 (unsigned long long)(code & KIND_MASK) << CODE_SHIFT;
    if ((uintptr_t)self >> 48) {
        PyErr_SetString(PyExc_RuntimeError, "a tensor at an address beyond 2**48: the memory log cannot name it");
        Py_DECREF(self);
        return NULL;
    }
    if (log_append(log, now, buffer_entry(self), nbytes) < 0) {
        Py_DECREF(self); /* nothing was logged: leave `ref` unset so the free is not either */
        return NULL;
    }
    Py_INCREF(log);
    self->ref = (PyObject *)log;
    if (log->live > log->peak) {
        log->peak = log->live;
        log->peak_index = log->len;
        if (log->live > log->capacity && log->enforce) {
            PyObject *r = PyObject_CallMethod((PyObject *)log, "out_of_memory", "Ll", nbytes, code);
            Py_XDECREF(r);
            if (!r) { Py_DECREF(self); return NULL; }
        }
    }
    if (info->nargs >= 0) store_args((PyObject *)self, info, fields, n);
    return (PyObject *)self;
}

PyObject *buffer_view(PyTypeObject *type, PyObject *source, PyObject *const *fields, Py_ssize_t n) {
    TypeInfo *info = type_info(type);
    if (!info || check_arg_count(type, info, n) < 0) return NULL;
    Buffer *owner = (Buffer *)source;
    if (owner->word & VIEW) owner = (Buffer *)owner->ref;
    Buffer *self = (Buffer *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    Py_INCREF(owner);
    self->ref = (PyObject *)owner;
    self->word = owner->word | VIEW;
    if (info->nargs >= 0) store_args((PyObject *)self, info, fields, n);
    return (PyObject *)self;
}

PyObject *buffer_clone(AllocLog *log, long long nbytes, PyObject *source) {
    PyTypeObject *type = Py_TYPE(source);
    TypeInfo *info = type_info(type);
    if (!info) return NULL;
    if (info->nargs < 0) {
        PyErr_Format(PyExc_TypeError, "%s has no _args: it cannot be cloned", type->tp_name);
        return NULL;
    }
    PyObject *fields[MAX_ARGS];
    for (Py_ssize_t i = 0; i < info->nargs; i++) {
        fields[i] = *(PyObject **)((char *)source + info->offsets[i]);
        if (!fields[i]) {
            PyErr_Format(PyExc_AttributeError, "%s: field %zd is unset", type->tp_name, i);
            return NULL;
        }
    }
    return buffer_alloc(type, log, nbytes, fields, info->nargs);
}

/* Cls(log, nbytes, *fields) allocates `nbytes` of the class's kind (`Cls.code`) on `log`;
 * Cls(tensor, nbytes, *fields) is a view of `tensor`'s buffer. The fields go to the slots `Cls._args`
 * names (trailing ones default to `Cls._defaults`); without `_args`, to the class's own __init__. */
static PyObject *Buffer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) < 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes a memory log or tensor and a byte count first", type->tp_name);
        return NULL;
    }
    PyObject *source = PyTuple_GET_ITEM(args, 0);
    PyObject *const *fields = &PyTuple_GET_ITEM(args, 2);
    Py_ssize_t n = PyTuple_GET_SIZE(args) - 2;
    if (PyObject_TypeCheck(source, &AllocLogType)) {
        long long nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(args, 1));
        if (nbytes == -1 && PyErr_Occurred()) return NULL;
        return buffer_alloc(type, (AllocLog *)source, nbytes, fields, n);
    }
    if (PyObject_TypeCheck(source, &BufferType)) return buffer_view(type, source, fields, n);
    PyErr_Format(PyExc_TypeError, "%s(): expected a memory log or a tensor to share, got %.100s",
                 type->tp_name, Py_TYPE(source)->tp_name);
    return NULL;
}

static int Buffer_traverse(Buffer *self, visitproc visit, void *arg) {
    Py_VISIT(self->ref);
    return 0;
}

static int Buffer_clear(Buffer *self) {
    Py_CLEAR(self->ref);
    return 0;
}

static void Buffer_dealloc(Buffer *self) {
    PyObject_GC_UnTrack(self);
    AllocLog *log = (AllocLog *)self->ref;
    if (log && !(self->word & VIEW)) {
        /* a free cannot fail: keep any exception in flight, and log what can be logged */
        PyObject *type = NULL, *value = NULL, *tb = NULL;
        int in_flight = PyErr_Occurred() != NULL;
        if (in_flight) PyErr_Fetch(&type, &value, &tb);
        double now = log_clock(log);
        if (now == -1.0 && PyErr_Occurred()) { PyErr_Clear(); now = 0.0; }
        if (log_append(log, now, buffer_entry(self) | FREE, -BUFFER_NBYTES(self)) < 0) PyErr_Clear();
        if (in_flight) PyErr_Restore(type, value, tb);
    }
    Buffer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The deallocator of the tensor classes (Python subclasses of Buffer with __slots__), as CPython's generic one
 * (`subtype_dealloc`, typeobject.c) runs for them, without what those classes do not have (an instance dict, weak
 * references, a finalizer): each class's slots cleared, from the first class with this deallocator down to
 * Buffer, most derived first and each in its own order (as `clear_slots` does: a slot holding another buffer, an
 * activation's stash, is freed before this buffer's free is logged), then Buffer's, then the reference to the
 * heap class. Classes below one with this deallocator that keep the generic one (a subclass) had theirs
 * cleared already: the generic deallocator stops at the first class with another one, and calls it. */
static void tensor_dealloc(PyObject *self) {
    PyTypeObject *type = Py_TYPE(self), *level = type;
    PyObject_GC_UnTrack(self);
    while (level->tp_dealloc != tensor_dealloc) level = level->tp_base;
    for (; level != &BufferType; level = level->tp_base) {
        /* a heap class's slots' member table follows the class object (`PyHeapType_GET_MEMBERS`) */
        PyMemberDef *member = (PyMemberDef *)((char *)level + Py_TYPE(level)->tp_basicsize);
        for (Py_ssize_t i = 0, n = Py_SIZE(level); i < n; i++, member++)
            if (member->type == T_OBJECT_EX && !(member->flags & READONLY)) {
                PyObject **slot = (PyObject **)((char *)self + member->offset);
                Py_CLEAR(*slot);
            }
    }
    Buffer_dealloc((Buffer *)self);
    Py_DECREF(type);
}

int fast_tensor_dealloc(PyTypeObject *type) {
    if (type->tp_dealloc == tensor_dealloc) return 0;
    /* every class from it down to Buffer a heap class of slots only, on the generic deallocator (or this one) */
    destructor generic = type->tp_dealloc;
    for (PyTypeObject *level = type; level != &BufferType; level = level->tp_base) {
        if (!level || !(level->tp_flags & Py_TPFLAGS_HEAPTYPE) ||
            (level->tp_dealloc != generic && level->tp_dealloc != tensor_dealloc) ||
            level->tp_dictoffset || level->tp_weaklistoffset || level->tp_finalize || level->tp_del ||
            !PyType_IsSubtype(level, &BufferType)) {
            PyErr_Format(PyExc_TypeError, "%s: not a class of slots over Buffer", type->tp_name);
            return -1;
        }
    }
    type->tp_dealloc = tensor_dealloc;
    return 0;
}

static PyObject *Buffer_nbytes(Buffer *self, void *closure) {
    return PyLong_FromLongLong(BUFFER_NBYTES(self));
}

static PyObject *Buffer_base(Buffer *self, void *closure) {
    PyObject *base = (self->word & VIEW) && self->ref ? self->ref : Py_None;
    Py_INCREF(base);
    return base;
}

static PyObject *Buffer_mem(Buffer *self, void *closure) {
    PyObject *log = !(self->word & VIEW) && self->ref ? self->ref : Py_None;
    Py_INCREF(log);
    return log;
}

static PyGetSetDef Buffer_getset[] = {
    {"nbytes", (getter)Buffer_nbytes, NULL, "bytes of the buffer", NULL},
    {"_base", (getter)Buffer_base, NULL, "for a view, the tensor owning the buffer", NULL},
    {"_mem", (getter)Buffer_mem, NULL, "the log this buffer was allocated on (None for a view)", NULL},
    {NULL}};

PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_lib._buffers.Buffer",
    .tp_doc = "Bytes on one rank, live while any tensor refers to them.",
    .tp_basicsize = sizeof(Buffer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = Buffer_new,
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_traverse = (traverseproc)Buffer_traverse,
    .tp_clear = (inquiry)Buffer_clear,
    .tp_getset = Buffer_getset,
};

/* ---- the records of what was handed in ----------------------------------------------------------- */

/* slot_records(objects, cls, names): the named slots of each object (all of class `cls`) as tuples.
 * A tuple of ints is untracked by the cycle collector, as CPython does on its first pass over one: a
 * step's records are tens of thousands of tuples, and the first collection after the step would
 * otherwise visit each. */
PyObject *slot_records(PyObject *module, PyObject *args) {
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
