/* C twins of `transfers.Transfer` and `transfers.Scheduler`: the links shared by transfers in flight,
 * advanced in virtual time (see engine/transfers.py, which stays the specification).
 *
 * Same state, same steps, same floating-point operations in the same order, so every end is
 * bit-identical to the Python one:
 * - loads and capacities are whole bytes/s kept as 64-bit integers (sums exact, as Python's ints);
 *   a share carried / wanted is one IEEE division of the two converted to double, which is what
 *   CPython's int / int does when both are at most 2**53; above that the division is done by Python's
 *   ints (correctly rounded), as in the specification;
 * - the two heaps are ordered by the keys of the Python tuples, (start, seq) and (end, seq, version),
 *   which are unique (seq is), so they pop in the same order whatever the heap's layout;
 * - the transfers on a link keep the order of the Python lists (appended at the end, the first
 *   occurrence removed).
 * The build turns off floating-point contraction (setup.py), so `(now - since) * speed` is rounded
 * before it is subtracted, as in Python.
 */
#include "_common.h"

#define EXACT_DOUBLE_INT (1LL << 53) /* ints up to this convert to double exactly */

/* ---- Transfer -------------------------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t link;
    long long rate;
} Use;

typedef struct {
    PyObject_HEAD
    double start, left, speed, since, end;
    long long version, seq;
    PyObject *usage, *finish, *owner, *key;
    Py_ssize_t nuses;
    Use *uses;                /* `usage` parsed once */
    unsigned long long mark;  /* the scheduler's pass that last reprojected it (`_reproject_all`'s set) */
} Transfer;


static PyObject *transfer_make(PyTypeObject *type, PyObject *start_obj, PyObject *duration_obj, PyObject *usage,
                               PyObject *finish, PyObject *owner, PyObject *key) {
    double start = PyFloat_AsDouble(start_obj);
    if (start == -1.0 && PyErr_Occurred()) return NULL;
    double duration = PyFloat_AsDouble(duration_obj);
    if (duration == -1.0 && PyErr_Occurred()) return NULL;
    if (!PyTuple_Check(usage)) {
        PyErr_Format(PyExc_TypeError, "Transfer: usage must be a tuple of (link id, bytes/s), not %.100s",
                     Py_TYPE(usage)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(usage);
    Use *uses = PyMem_Malloc((n ? n : 1) * sizeof(Use));
    if (!uses) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(usage, i);
        long long link = -1, rate = -1;
        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 && PyLong_Check(PyTuple_GET_ITEM(pair, 0)) &&
            PyLong_Check(PyTuple_GET_ITEM(pair, 1))) {
            link = long_long_of(PyTuple_GET_ITEM(pair, 0));
            rate = link < 0 ? -1 : long_long_of(PyTuple_GET_ITEM(pair, 1));
            PyErr_Clear();
        }
        if (link < 0 || rate < 0) {
            PyMem_Free(uses);
            PyErr_Format(PyExc_TypeError, "Transfer: usage[%zd] must be (link id, bytes/s), two whole numbers "
                         "from 0 to 2**63", i);
            return NULL;
        }
        uses[i].link = (Py_ssize_t)link;
        uses[i].rate = rate;
    }
    Transfer *self = PyObject_GC_New(Transfer, type);
    if (!self) {
        PyMem_Free(uses);
        return NULL;
    }
    self->start = start;
    self->left = duration;
    self->speed = 1.0;
    self->since = start;
    self->end = start + duration;
    self->version = 0;
    self->seq = 0;
    self->usage = Py_NewRef(usage);
    self->finish = Py_NewRef(finish);
    self->owner = Py_NewRef(owner);
    self->key = Py_NewRef(key);
    self->nuses = n;
    self->uses = uses;
    self->mark = 0;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *Transfer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"start", "duration", "usage", "finish", "owner", "key", NULL};
    PyObject *start, *duration, *usage, *finish, *owner, *key;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO:Transfer", names, &start, &duration, &usage, &finish,
                                     &owner, &key))
        return NULL;
    return transfer_make(type, start, duration, usage, finish, owner, key);
}

/* `Transfer(start, duration, usage, finish, owner, key)` as the callers make it: positionally. */
static PyObject *Transfer_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames || nargs != 6) {
        PyObject *tuple = PyTuple_New(nargs);
        if (!tuple) return NULL;
        for (Py_ssize_t i = 0; i < nargs; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
        PyObject *kwargs = NULL;
        if (kwnames) {
            kwargs = PyDict_New();
            for (Py_ssize_t i = 0; kwargs && i < PyTuple_GET_SIZE(kwnames); i++)
                if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) Py_CLEAR(kwargs);
            if (!kwargs) {
                Py_DECREF(tuple);
                return NULL;
            }
        }
        PyObject *made = Transfer_new((PyTypeObject *)type, tuple, kwargs);
        Py_DECREF(tuple);
        Py_XDECREF(kwargs);
        return made;
    }
    return transfer_make((PyTypeObject *)type, args[0], args[1], args[2], args[3], args[4], args[5]);
}

static int Transfer_traverse(Transfer *self, visitproc visit, void *arg) {
    Py_VISIT(self->usage);
    Py_VISIT(self->finish);
    Py_VISIT(self->owner);
    Py_VISIT(self->key);
    return 0;
}

static int Transfer_clear(Transfer *self) {
    Py_CLEAR(self->finish);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->key);
    return 0; /* `usage` stays: it is a tuple of ints (no cycle through it) that `uses` mirrors */
}

static void Transfer_dealloc(Transfer *self) {
    PyObject_GC_UnTrack(self);
    Transfer_clear(self);
    Py_CLEAR(self->usage);
    PyMem_Free(self->uses);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int transfer_times(PyObject *t, double *start, double *end) {
    if (!PyObject_TypeCheck(t, &TransferType)) return 0;
    *start = ((Transfer *)t)->start;
    *end = ((Transfer *)t)->end;
    return 1;
}

static PyMemberDef Transfer_members[] = {
    {"start", T_DOUBLE, offsetof(Transfer, start), 0, "when it may start (virtual seconds)"},
    {"usage", T_OBJECT, offsetof(Transfer, usage), READONLY, "((link id, bytes/s wanted), ...)"},
    {"finish", T_OBJECT, offsetof(Transfer, finish), 0, "finish(engine, transfer), once its end is final"},
    {"owner", T_OBJECT, offsetof(Transfer, owner), 0, "the collective or the message"},
    {"key", T_OBJECT, offsetof(Transfer, key), 0, "orders transfers that end at the same instant"},
    {"left", T_DOUBLE, offsetof(Transfer, left), 0, "seconds of transfer still to do at full speed, as of since"},
    {"speed", T_DOUBLE, offsetof(Transfer, speed), 0, "share of its full speed it moves at"},
    {"since", T_DOUBLE, offsetof(Transfer, since), 0, "when `left` was last settled"},
    {"end", T_DOUBLE, offsetof(Transfer, end), 0, "its end: projected while in flight, final once it ended"},
    {"version", T_LONGLONG, offsetof(Transfer, version), 0, "its projection's number (-1 once it ended)"},
    {"seq", T_LONGLONG, offsetof(Transfer, seq), 0, "its order of arrival at the scheduler"},
    {NULL}};

PyTypeObject TransferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_lib._buffers.Transfer",
    .tp_doc = "Transfer(start, duration, usage, finish, owner, key)\n--\n\n"
              "One collective or message: when it may start, its time alone, the links it uses.",
    .tp_basicsize = sizeof(Transfer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Transfer_new,
    .tp_vectorcall = Transfer_vectorcall,
    .tp_dealloc = (destructor)Transfer_dealloc,
    .tp_traverse = (traverseproc)Transfer_traverse,
    .tp_clear = (inquiry)Transfer_clear,
    .tp_members = Transfer_members,
};

/* ---- Scheduler ------------------------------------------------------------------------------------- */

typedef struct {
    double at;          /* start (waiting) or end (in flight) */
    long long seq, version;
    Transfer *transfer; /* a reference */
} Entry;

typedef struct {
    Entry *items;
    Py_ssize_t size, cap;
} Heap;

typedef struct {
    Transfer **items; /* references (on a link) or borrowed (the scratch list of touched transfers) */
    Py_ssize_t size, cap;
} Transfers;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nlinks;
    long long *capacity, *load;
    Transfers *on_link;
    Heap waiting, ends;
    Transfers touched;
    double now;
    long long count;
    unsigned long long pass; /* one per `_reproject_all` */
} Scheduler;

static int entry_before(const Entry *a, const Entry *b) {
    if (a->at != b->at) return a->at < b->at;
    if (a->seq != b->seq) return a->seq < b->seq;
    return a->version < b->version;
}

static int heap_push(Heap *heap, double at, long long seq, long long version, Transfer *transfer) {
    if (heap->size == heap->cap) {
        Py_ssize_t cap = heap->cap ? 2 * heap->cap : 64;
        Entry *items = PyMem_Realloc(heap->items, cap * sizeof(Entry));
        if (!items) {
            PyErr_NoMemory();
            return -1;
        }
        heap->items = items;
        heap->cap = cap;
    }
    Entry entry = {at, seq, version, (Transfer *)Py_NewRef(transfer)};
    Entry *items = heap->items;
    Py_ssize_t i = heap->size++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!entry_before(&entry, &items[parent])) break;
        items[i] = items[parent];
        i = parent;
    }
    items[i] = entry;
    return 0;
}

/* Remove the first entry; its reference passes to the caller. */
static Entry heap_pop(Heap *heap) {
    Entry *items = heap->items, top = items[0], last = items[--heap->size];
    Py_ssize_t n = heap->size, i = 0;
    for (;;) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && entry_before(&items[child + 1], &items[child])) child++;
        if (!entry_before(&items[child], &last)) break;
        items[i] = items[child];
        i = child;
    }
    if (n) items[i] = last;
    return top;
}

static int transfers_append(Transfers *list, Transfer *transfer) {
    if (list->size == list->cap) {
        Py_ssize_t cap = list->cap ? 2 * list->cap : 4;
        Transfer **items = PyMem_Realloc(list->items, cap * sizeof(Transfer *));
        if (!items) {
            PyErr_NoMemory();
            return -1;
        }
        list->items = items;
        list->cap = cap;
    }
    list->items[list->size++] = transfer;
    return 0;
}

static int transfers_extend(Transfers *list, const Transfers *more) {
    for (Py_ssize_t i = 0; i < more->size; i++)
        if (transfers_append(list, more->items[i]) < 0) return -1;
    return 0;
}

static PyObject *Scheduler_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"capacity", NULL};
    PyObject *capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Scheduler", names, &capacity)) return NULL;
    PyObject *seq = PySequence_Fast(capacity, "Scheduler: capacity must be a list of bytes/s per link");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Scheduler *self = (Scheduler *)type->tp_alloc(type, 0);
    if (!self) {
        Py_DECREF(seq);
        return NULL;
    }
    self->nlinks = n;
    self->capacity = PyMem_Calloc(n ? n : 1, sizeof(long long));
    self->load = PyMem_Calloc(n ? n : 1, sizeof(long long));
    self->on_link = PyMem_Calloc(n ? n : 1, sizeof(Transfers));
    if (!self->capacity || !self->load || !self->on_link) {
        Py_DECREF(seq);
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        long long c = PyLong_Check(item) ? PyLong_AsLongLong(item) : -1;
        if (c < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "Scheduler: capacity[%zd] must be a whole number of bytes/s from 0 to "
                         "2**63", i);
            Py_DECREF(seq);
            Py_DECREF(self);
            return NULL;
        }
        self->capacity[i] = c;
    }
    Py_DECREF(seq);
    return (PyObject *)self;
}

static int Scheduler_traverse(Scheduler *self, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < self->waiting.size; i++) Py_VISIT(self->waiting.items[i].transfer);
    for (Py_ssize_t i = 0; i < self->ends.size; i++) Py_VISIT(self->ends.items[i].transfer);
    for (Py_ssize_t link = 0; self->on_link && link < self->nlinks; link++)
        for (Py_ssize_t i = 0; i < self->on_link[link].size; i++) Py_VISIT(self->on_link[link].items[i]);
    return 0;
}

static int Scheduler_clear(Scheduler *self) {
    while (self->waiting.size) Py_DECREF(self->waiting.items[--self->waiting.size].transfer);
    while (self->ends.size) Py_DECREF(self->ends.items[--self->ends.size].transfer);
    for (Py_ssize_t link = 0; self->on_link && link < self->nlinks; link++) {
        Transfers *peers = &self->on_link[link];
        while (peers->size) Py_DECREF(peers->items[--peers->size]);
    }
    self->touched.size = 0;
    return 0;
}

static void Scheduler_dealloc(Scheduler *self) {
    PyObject_GC_UnTrack(self);
    Scheduler_clear(self);
    for (Py_ssize_t link = 0; self->on_link && link < self->nlinks; link++) PyMem_Free(self->on_link[link].items);
    PyMem_Free(self->on_link);
    PyMem_Free(self->capacity);
    PyMem_Free(self->load);
    PyMem_Free(self->waiting.items);
    PyMem_Free(self->ends.items);
    PyMem_Free(self->touched.items);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_links(Scheduler *self, Transfer *transfer) {
    for (Py_ssize_t i = 0; i < transfer->nuses; i++)
        if (transfer->uses[i].link >= self->nlinks) {
            PyErr_Format(PyExc_IndexError, "Transfer: link %zd of its usage is not one of the scheduler's %zd links",
                         transfer->uses[i].link, self->nlinks);
            return -1;
        }
    return 0;
}

/* carried / wanted, rounded once, as Python divides two ints; -1.0 with an exception on error. */
static double share(long long carried, long long wanted) {
    if (carried <= EXACT_DOUBLE_INT && wanted <= EXACT_DOUBLE_INT) return (double)carried / (double)wanted;
    PyObject *a = PyLong_FromLongLong(carried), *b = a ? PyLong_FromLongLong(wanted) : NULL;
    PyObject *q = b ? PyNumber_TrueDivide(a, b) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (!q) return -1.0;
    double value = PyFloat_AS_DOUBLE(q);
    Py_DECREF(q);
    return value;
}

/* `costs.shared_speed` over the scheduler's arrays; -1.0 with an exception on error. */
static double shared_speed(Scheduler *self, Transfer *transfer) {
    double speed = 1.0;
    const long long *load = self->load, *capacity = self->capacity;
    for (Py_ssize_t i = 0; i < transfer->nuses; i++) {
        Py_ssize_t link = transfer->uses[i].link;
        long long wanted = load[link], carried = capacity[link];
        if (wanted > carried) {
            double s = share(carried, wanted);
            if (s < 0.0) return -1.0;
            if (s < speed) speed = s;
        }
    }
    return speed;
}

/* now + left / speed, raising as Python does for a speed of 0 */
static int project(Transfer *transfer, double now, double speed) {
    if (speed == 0.0) {
        PyErr_SetString(PyExc_ZeroDivisionError, "float division by zero");
        return -1;
    }
    transfer->end = now + transfer->left / speed;
    return 0;
}

static int reproject(Scheduler *self, Transfer *transfer) {
    double now = self->now;
    if (now > transfer->since) {
        transfer->left -= (now - transfer->since) * transfer->speed;
        if (transfer->left < 0.0) transfer->left = 0.0;
        transfer->since = now;
    }
    double speed = shared_speed(self, transfer);
    if (speed < 0.0) return -1;
    if (speed == transfer->speed && transfer->version) return 0; /* its projected end stands */
    transfer->speed = speed;
    transfer->version += 1;
    if (project(transfer, now, speed) < 0) return -1;
    return heap_push(&self->ends, transfer->end, transfer->seq, transfer->version, transfer);
}

/* Reproject each transfer touched (once, skipping those that ended), and empty the list. */
static int reproject_touched(Scheduler *self) {
    unsigned long long pass = ++self->pass;
    Transfers *touched = &self->touched;
    int status = 0;
    for (Py_ssize_t i = 0; i < touched->size && status == 0; i++) {
        Transfer *t = touched->items[i];
        if (t->version >= 0 && t->mark != pass) {
            t->mark = pass;
            status = reproject(self, t);
        }
    }
    touched->size = 0;
    return status;
}

static int begin(Scheduler *self, Transfer *transfer) {
    long long *load = self->load;
    self->touched.size = 0;
    for (Py_ssize_t i = 0; i < transfer->nuses; i++) {
        Py_ssize_t link = transfer->uses[i].link;
        if (__builtin_add_overflow(load[link], transfer->uses[i].rate, &load[link])) {
            PyErr_Format(PyExc_OverflowError, "link %zd: the transfers in flight want more than 2**63 bytes/s", link);
            return -1;
        }
        Transfers *peers = &self->on_link[link];
        if (peers->size && transfers_extend(&self->touched, peers) < 0) return -1;
        if (transfers_append(peers, transfer) < 0) return -1;
        Py_INCREF(transfer);
    }
    double now = transfer->since = self->now;
    double speed = shared_speed(self, transfer);
    if (speed < 0.0) return -1;
    transfer->speed = speed;
    transfer->version = 1;
    if (project(transfer, now, speed) < 0) return -1;
    if (heap_push(&self->ends, transfer->end, transfer->seq, 1, transfer) < 0) return -1;
    return self->touched.size ? reproject_touched(self) : 0;
}

static int leave(Scheduler *self, Transfer *transfer) {
    long long *load = self->load;
    self->touched.size = 0;
    for (Py_ssize_t i = 0; i < transfer->nuses; i++) {
        Py_ssize_t link = transfer->uses[i].link;
        load[link] -= transfer->uses[i].rate;
        Transfers *peers = &self->on_link[link];
        Py_ssize_t at = 0;
        while (at < peers->size && peers->items[at] != transfer) at++;
        if (at == peers->size) {
            PyErr_SetString(PyExc_ValueError, "list.remove(x): x not in list");
            return -1;
        }
        memmove(peers->items + at, peers->items + at + 1, (peers->size - at - 1) * sizeof(Transfer *));
        peers->size--;
        Py_DECREF(transfer); /* the caller holds it */
        if (peers->size && transfers_extend(&self->touched, peers) < 0) return -1;
    }
    return self->touched.size ? reproject_touched(self) : 0;
}

static PyObject *Scheduler_add(Scheduler *self, PyObject *arg) {
    if (Py_TYPE(arg) != &TransferType) {
        PyErr_Format(PyExc_TypeError, "Scheduler.add: expected a Transfer, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Transfer *transfer = (Transfer *)arg;
    if (check_links(self, transfer) < 0) return NULL;
    self->count += 1;
    transfer->seq = self->count;
    if (transfer->start < self->now) transfer->start = transfer->since = self->now;
    if (heap_push(&self->waiting, transfer->start, transfer->seq, 0, transfer) < 0) return NULL;
    Py_RETURN_NONE;
}

/* `next_completions` never past `horizon` nor onto a link with a nonzero byte in `barred` (NULL: none):
 * `Scheduler.completions_until` in transfers.py, which `next_completions` is with an infinite horizon. */
static PyObject *run_until(Scheduler *self, double horizon, const unsigned char *barred) {
    Heap *waiting = &self->waiting, *ends = &self->ends;
    for (;;) {
        while (ends->size && ends->items[0].version != ends->items[0].transfer->version) {
            Entry stale = heap_pop(ends); /* a superseded projection */
            Py_DECREF(stale.transfer);
        }
        if (waiting->size && waiting->items[0].at < horizon &&
            (!ends->size || waiting->items[0].at < ends->items[0].at)) {
            if (barred) {
                Transfer *next = waiting->items[0].transfer;
                for (Py_ssize_t i = 0; i < next->nuses; i++)
                    if (barred[next->uses[i].link]) return PyList_New(0);
            }
            Entry first = heap_pop(waiting);
            self->now = first.at;
            int status = begin(self, first.transfer);
            Py_DECREF(first.transfer);
            if (status < 0) return NULL;
            continue;
        }
        if (!ends->size || ends->items[0].at > horizon) return PyList_New(0);
        double end = ends->items[0].at;
        self->now = end;
        PyObject *done = PyList_New(0);
        if (!done) return NULL;
        while (ends->size && ends->items[0].at == end) {
            Entry entry = heap_pop(ends);
            Transfer *transfer = entry.transfer;
            if (entry.version == transfer->version) {
                transfer->end = end;
                transfer->version = -1; /* ended: not to be projected again */
                if (PyList_Append(done, (PyObject *)transfer) < 0) {
                    Py_DECREF(transfer);
                    Py_DECREF(done);
                    return NULL;
                }
            }
            Py_DECREF(transfer);
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(done); i++)
            if (leave(self, (Transfer *)PyList_GET_ITEM(done, i)) < 0) {
                Py_DECREF(done);
                return NULL;
            }
        return done;
    }
}

static PyObject *Scheduler_next_completions(Scheduler *self, PyObject *Py_UNUSED(ignored)) {
    return run_until(self, Py_HUGE_VAL, NULL);
}

static PyObject *Scheduler_completions_until(Scheduler *self, PyObject *args) {
    double horizon;
    Py_buffer barred = {0};
    if (!PyArg_ParseTuple(args, "d|y*:completions_until", &horizon, &barred)) return NULL;
    if (barred.buf && barred.len && barred.len != self->nlinks) {
        PyErr_Format(PyExc_ValueError, "completions_until: barred has %zd bytes for %zd links", barred.len,
                     self->nlinks);
        PyBuffer_Release(&barred);
        return NULL;
    }
    PyObject *done = run_until(self, horizon, barred.len ? (const unsigned char *)barred.buf : NULL);
    if (barred.buf) PyBuffer_Release(&barred);
    return done;
}

static PyObject *Scheduler_adopt(Scheduler *self, PyObject *arg) {
    if (Py_TYPE(arg) != &TransferType) {
        PyErr_Format(PyExc_TypeError, "Scheduler.adopt: expected a Transfer, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Transfer *transfer = (Transfer *)arg;
    if (check_links(self, transfer) < 0) return NULL;
    self->count += 1;
    transfer->seq = self->count;
    long long *load = self->load;
    for (Py_ssize_t i = 0; i < transfer->nuses; i++) {
        Py_ssize_t link = transfer->uses[i].link;
        if (__builtin_add_overflow(load[link], transfer->uses[i].rate, &load[link])) {
            PyErr_Format(PyExc_OverflowError, "link %zd: the transfers in flight want more than 2**63 bytes/s", link);
            return NULL;
        }
        if (transfers_append(&self->on_link[link], transfer) < 0) return NULL;
        Py_INCREF(transfer);
    }
    if (heap_push(&self->ends, transfer->end, transfer->seq, transfer->version, transfer) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Scheduler_pending(Scheduler *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *found = PyList_New(0); /* (seq, transfer): sorted by seq, which no two share */
    if (!found) return NULL;
    Heap *heaps[2] = {&self->ends, &self->waiting};
    for (int h = 0; h < 2; h++)
        for (Py_ssize_t i = 0; i < heaps[h]->size; i++) {
            Entry *entry = &heaps[h]->items[i];
            if (h == 0 && entry->version != entry->transfer->version) continue; /* a superseded projection */
            PyObject *pair = Py_BuildValue("(LO)", entry->transfer->seq, (PyObject *)entry->transfer);
            if (!pair || PyList_Append(found, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(found);
                return NULL;
            }
            Py_DECREF(pair);
        }
    if (PyList_Sort(found) < 0) {
        Py_DECREF(found);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(found); i++) {
        PyObject *transfer = Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(found, i), 1));
        PyList_SetItem(found, i, transfer);
    }
    return found;
}

static PyObject *int_list(const long long *values, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static PyObject *Scheduler_capacity(Scheduler *self, void *Py_UNUSED(closure)) {
    return int_list(self->capacity, self->nlinks);
}

static PyObject *Scheduler_load(Scheduler *self, void *Py_UNUSED(closure)) {
    return int_list(self->load, self->nlinks);
}

static PyMethodDef Scheduler_methods[] = {
    {"add", (PyCFunction)Scheduler_add, METH_O,
     "add($self, transfer, /)\n--\n\nA transfer whose start is known (never before `now`)."},
    {"pending", (PyCFunction)Scheduler_pending, METH_NOARGS,
     "pending($self, /)\n--\n\nEvery transfer not ended, waiting (version 0) or in flight, in the order they were "
     "added."},
    {"adopt", (PyCFunction)Scheduler_adopt, METH_O,
     "adopt($self, transfer, /)\n--\n\nA transfer in flight on another scheduler, with its progress: it adds its "
     "loads and keeps its projection."},
    {"next_completions", (PyCFunction)Scheduler_next_completions, METH_NOARGS,
     "next_completions($self, /)\n--\n\nAdvance to the earliest end of a transfer and return every transfer that "
     "ends then (empty when nothing is left). Starts at that same instant are taken after the ends."},
    {"completions_until", (PyCFunction)Scheduler_completions_until, METH_VARARGS,
     "completions_until($self, horizon, barred=b'', /)\n--\n\nnext_completions, but never past `horizon` nor onto "
     "a link whose byte in `barred` is nonzero; nothing when the next end comes later."},
    {NULL}};

static PyMemberDef Scheduler_members[] = {
    {"now", T_DOUBLE, offsetof(Scheduler, now), 0,
     "the virtual time the links have been run to (set back only by a split step's handover)"},
    {"count", T_LONGLONG, offsetof(Scheduler, count), READONLY, "transfers added so far"},
    {NULL}};

static PyGetSetDef Scheduler_getset[] = {
    {"capacity", (getter)Scheduler_capacity, NULL, "bytes/s each link carries (a copy)", NULL},
    {"load", (getter)Scheduler_load, NULL, "bytes/s wanted by the transfers in flight on each link (a copy)", NULL},
    {NULL}};

PyTypeObject SchedulerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "dist_lib._buffers.Scheduler",
    .tp_doc = "Scheduler(capacity)\n--\n\nTransfers waiting to start and in flight, advanced in virtual time order.",
    .tp_basicsize = sizeof(Scheduler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Scheduler_new,
    .tp_dealloc = (destructor)Scheduler_dealloc,
    .tp_traverse = (traverseproc)Scheduler_traverse,
    .tp_clear = (inquiry)Scheduler_clear,
    .tp_methods = Scheduler_methods,
    .tp_members = Scheduler_members,
    .tp_getset = Scheduler_getset,
};
