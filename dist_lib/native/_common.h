/* What the C twins share: the buffers' layout and their allocation (`_buffers.c`), the helpers every
 * twin's install and fast paths use (`_common.c`), and each twin's entry points, which the module's one
 * table (`_module.c`) lists. A twin's file calls no other twin's install. */
#ifndef DIST_LIB_COMMON_H
#define DIST_LIB_COMMON_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#define KIND_MASK 7 /* low bits of a tag: the kind code (memory.KIND_BITS) */

#define SHAPE_BITS 19 /* shape numbers: distinct (bytes, kind) pairs per rank */
#define SHAPE_MASK ((1ULL << SHAPE_BITS) - 1)
#define FREE (1ULL << SHAPE_BITS)
#define ADDRESS_SHIFT (SHAPE_BITS + 1) /* 16-byte aligned addresses below 2**48 fill the other 44 bits */

typedef struct {
    PyObject_HEAD
    PyObject *owner; /* whose `clock` stamps the log */
    long long live;
    long long peak;
    long long capacity;
    Py_ssize_t peak_index; /* entries up to and including the peak */
    char enforce;
    /* entries: which buffer of which shape was allocated or freed, as
     * buffer address >> 4 << ADDRESS_SHIFT | FREE | shape number */
    Py_ssize_t len, cap;
    uint64_t *entries;
    /* when: one time per run of entries logged at the same time; run r starts at entry run_first[r] */
    Py_ssize_t nruns, runs_cap;
    double *run_time;
    uint32_t *run_first;
    /* shapes: the distinct (bytes, kind) pairs, numbered in order of first use, and a hash index */
    Py_ssize_t nshapes, shapes_cap, index_cap;
    long long *shape_bytes;
    unsigned char *shape_code;
    int32_t *index; /* open addressing; -1 is empty */
} AllocLog;

/* Two words after the object header, as every live tensor is one: what the buffer hangs on, and its
 * size, shape number, kind and whether it is a view. */
typedef struct {
    PyObject_HEAD
    PyObject *ref;           /* the AllocLog it was allocated on; for a view, the owning Buffer */
    unsigned long long word; /* nbytes | shape << SHAPE_SHIFT | kind code << CODE_SHIFT | VIEW */
} Buffer;

#define SHAPE_SHIFT 40
#define NBYTES_MASK ((1ULL << SHAPE_SHIFT) - 1) /* a buffer holds less than a TiB */
#define CODE_SHIFT 59
#define VIEW (1ULL << 63)
#define BUFFER_NBYTES(b) ((long long)((b)->word & NBYTES_MASK))
#define BUFFER_SHAPE(b) ((b)->word >> SHAPE_SHIFT & SHAPE_MASK)
#define BUFFER_CODE(b) ((long long)(((b)->word >> CODE_SHIFT) & KIND_MASK))

/* The log a tensor's bytes are on (its owner's, for a view), or NULL: a rank's log is one step's
 * (`Model._mem`), so a tensor an op of this step may take is on the rank's log of this step. */
static inline PyObject *buffer_log(PyObject *tensor) {
    Buffer *b = (Buffer *)tensor;
    if (b->word & VIEW) b = (Buffer *)b->ref;
    return b && !(b->word & VIEW) ? b->ref : NULL;
}

extern PyTypeObject AllocLogType;
extern PyTypeObject BufferType;

/* The owner's clock, or -1 with an exception set. */
double log_clock(AllocLog *log);
/* Read clocks of owners of this type straight from this slot (set once the class is known). */
void set_clock_slot(PyTypeObject *type, Py_ssize_t offset);
/* type(log, nbytes, *fields) and type(tensor, nbytes, *fields) without building an argument tuple. */
PyObject *buffer_alloc(PyTypeObject *type, AllocLog *log, long long nbytes, PyObject *const *fields, Py_ssize_t n);
PyObject *buffer_view(PyTypeObject *type, PyObject *source, PyObject *const *fields, Py_ssize_t n);
/* Give a tensor class (a heap subclass of Buffer with slots only) the deallocator of such classes
 * (`_buffers.c`); 0, or -1 with TypeError for another class. */
int fast_tensor_dealloc(PyTypeObject *type);
/* A new buffer of `nbytes` on `log` of source's class, with source's `_args` fields. */
PyObject *buffer_clone(AllocLog *log, long long nbytes, PyObject *source);

/* ---- helpers (`_common.c`) ------------------------------------------------------------------------ */

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* An int's digits, where this build knows CPython's layout of them (30-bit digits since 3.11's
 * `cpython/longintrepr.h`; the sign and count moved into `lv_tag` in 3.12): a mask's bits, and a small int's
 * value, are read without a call. Other versions go through the C API. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
#define MASK_DIGITS(x) (((PyLongObject *)(x))->ob_digit)
#define MASK_NDIGITS(x) Py_SIZE(x) /* negative for a negative int */
#elif PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030F0000 && PYLONG_BITS_IN_DIGIT == 30
#define MASK_DIGITS(x) (((PyLongObject *)(x))->long_value.ob_digit)
#define MASK_NDIGITS(x) \
    ((((PyLongObject *)(x))->long_value.lv_tag & 3) == 2 ? -(Py_ssize_t)(((PyLongObject *)(x))->long_value.lv_tag >> 3) \
                                                         : (Py_ssize_t)(((PyLongObject *)(x))->long_value.lv_tag >> 3))
#endif

/* An exact int's value when it fits a long, else `fallback` (never raises). An int of one digit (below 2**30
 * in size), or of two where a long has 64 bits, is read from its digits. */
static inline long small_int(PyObject *x, long fallback) {
    if (!x || !PyLong_CheckExact(x)) return fallback;
#ifdef MASK_DIGITS
    Py_ssize_t ndigits = MASK_NDIGITS(x);
    if ((ndigits >= -1 && ndigits <= 1) || (sizeof(long) >= 8 && (ndigits == 2 || ndigits == -2))) {
        const digit *d = MASK_DIGITS(x);
        long v = ndigits == 0 ? 0 : (long)d[0];
        if (ndigits == 2 || ndigits == -2) v |= (long)d[1] << PyLong_SHIFT;
        return ndigits < 0 ? -v : v;
    }
#endif
    int overflow;
    long v = PyLong_AsLongAndOverflow(x, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return fallback; }
    return v;
}

/* PyLong_AsLongLong, reading an exact int of up to two digits (below 2**60 in size, where a long has 64 bits)
 * from its digits: CPython converts an int of more than one digit through a byte array. */
static inline long long long_long_of(PyObject *x) {
#ifdef MASK_DIGITS
    if (PyLong_CheckExact(x)) {
        Py_ssize_t ndigits = MASK_NDIGITS(x);
        if (ndigits >= -2 && ndigits <= 2) {
            const digit *d = MASK_DIGITS(x);
            long long v = ndigits == 0 ? 0 : (long long)d[0];
            if (ndigits == 2 || ndigits == -2) v |= (long long)d[1] << PyLong_SHIFT;
            return ndigits < 0 ? -v : v;
        }
    }
#endif
    return PyLong_AsLongLong(x);
}

/* a == b for two ints (identity first: small ints are shared; then two ints read from their digits).
 * -1 with an exception set on error. */
static inline int int_eq(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (!a || !b) return 0;
#ifdef MASK_DIGITS
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b)) {
        Py_ssize_t na = MASK_NDIGITS(a), nb = MASK_NDIGITS(b);
        if (na != nb) return 0;
        if ((na >= -1 && na <= 1) || (sizeof(long) >= 8 && (na == 2 || na == -2)))
            return small_int(a, 0) == small_int(b, 0);
    }
#endif
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* Record the event (rank, op, stream, start, end, layer, samples, nbytes, flops, peers, op_id, detail) of these
 * 12 fields (borrowed) on the log whose recent tuples are the list `events`: staged as a row of its columns
 * where the log stages them (`_events.c`), else appended to `events` as a tuple. 0, or -1 with an exception. */
int append_event(PyObject *events, PyObject *const *fields);
/* Events of that log not yet packed: its recent tuples and its staged rows. */
Py_ssize_t pending_events(PyObject *events);
/* `engine.new_op_id()`: add one to the engine's attribute `next_op_id` (the interned name) and return the
 * new id (a new reference), or NULL with an exception. */
PyObject *take_op_id(PyObject *engine, PyObject *next_op_id);
/* Set bits of a non-negative mask (its samples); -1 if it is not one (never raises). */
long mask_bit_count(PyObject *mask);
int mask_bounds(PyObject *mask, long *first, long *stop);
/* Do two masks share a bit? 1 or 0, or -1 with an exception set. */
int masks_overlap(PyObject *a, PyObject *b);
/* a | b of two masks that share no bit: 0 and *out the union (a new reference); 1 if they share one; -1 with
 * an exception. Masks of three digits and more are read and made digit by digit, in one pass. */
int masks_join(PyObject *a, PyObject *b, PyObject **out);
/* Is `mask` == (1 << n) - 1, every one of n shards (never raises)? */
int is_full_mask(PyObject *mask, long n);
/* Call the Python twin with self first (dropping any exception set on the way: the twin meets and
 * reports the same problem). */
PyObject *fallback(PyObject *twin, PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
/* The offset of the slot `name` of `cls`; -1 with TypeError if it is not an object slot. */
int slot_offset(PyObject *cls, const char *name, Py_ssize_t *out);
/* getattr(obj, name) for an interned `name`, read from where the object's class keeps that slot once it was
 * found there (a new reference, or NULL with the exception getattr raises). */
PyObject *slot_get(PyObject *obj, PyObject *name);
/* `engine.wake(work)`: the C wake (`_drive.c`) straight while it is the engine's, else the method. */
PyObject *engine_wake(PyObject *engine, PyObject *work);
/* A Transfer's start and end (`_transfers.c`): 1, or 0 (never raises) if `t` is not a Transfer. */
int transfer_times(PyObject *t, double *start, double *end);
/* Do the classes `siblings` have the slots `names` at the offsets `want` (those of the class the fast ops
 * read them from)? 0, or -1 with TypeError naming the first that does not. */
int same_layout(PyObject *const *siblings, int nsiblings, const char *const *names, const Py_ssize_t *want,
                int nnames);
/* Put `def` on `cls`, keeping the Python method in *twin; docs[name] (kept alive by the caller) becomes
 * the C method's signature and docstring. */
int replace_method(PyObject *cls, PyMethodDef *def, PyObject **twin, PyObject *docs);
/* A class `module` defines, to store in *out (replacing a reference held there). */
typedef struct { const char *name; PyTypeObject **out; } ClassRef;
/* Look up each of `refs` on `module` (named `where` in errors). 0, or -1 with an exception (TypeError
 * if one is not a class). */
int load_classes(PyObject *module, const char *where, const ClassRef *refs, size_t n);
/* Names the types read, interned once (`common_ready`), and `array.array`. */
extern PyObject *str_clock, *str_code, *str_args, *str_defaults, *str_frombytes, *array_type;
/* The helpers' own state (the names above, int's C methods): made once, when the module is. 0, or -1 with
 * an exception. */
int common_ready(void);

/* ---- the twins' entry points, as `_module.c` lists them ------------------------------------------ */

/* buffers (`_buffers.c`): AllocLog, Buffer (above) and slot_records */
PyObject *slot_records(PyObject *module, PyObject *args);
/* events (`_events.c`): KindIndex and pack_events */
extern PyTypeObject KindIndexType;
PyObject *pack_events(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* transfers (`_transfers.c`): Transfer and Scheduler */
extern PyTypeObject TransferType, SchedulerType;
/* ops and weight_ops (`_tensor_ops.c`) */
PyObject *install_ops(PyObject *module, PyObject *args);
PyObject *install_weight_ops(PyObject *module, PyObject *args);
/* comm (`_comm.c`) */
PyObject *install_comm_ops(PyObject *module, PyObject *args);
/* p2p (`_p2p.c`) */
PyObject *install_p2p_ops(PyObject *module, PyObject *args);
/* drive (`_drive.c`) */
PyObject *install_drive(PyObject *module, PyObject *args);

#endif
