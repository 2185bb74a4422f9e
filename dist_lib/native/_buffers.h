/* What `_buffers.c` (buffers and their log), `_ops.c` (the hottest ops), `_events.c` (packing the
 * event log) and `_transfers.c` (the transfer scheduler) share. */
#ifndef DIST_LIB_BUFFERS_H
#define DIST_LIB_BUFFERS_H

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
/* A new buffer of `nbytes` on `log` of source's class, with source's `_args` fields. */
PyObject *buffer_clone(AllocLog *log, long long nbytes, PyObject *source);

/* Adds the hot ops' `install` to the module (`_ops.c`). */
int ops_init(PyObject *module);
/* Adds `install_weight_ops` to the module (`_weight_ops.c`). */
int weight_ops_init(PyObject *module);
/* Adds `install_comm_ops` to the module (`_comm_ops.c`). */
int comm_ops_init(PyObject *module);
/* Adds `install_p2p_ops` to the module (`_p2p_ops.c`). */
int p2p_ops_init(PyObject *module);
/* Adds `KindIndex` and `pack_events` to the module (`_events.c`). */
int events_init(PyObject *module);
/* Adds `Transfer` and `Scheduler`, the twins of engine/transfers.py's, to the module (`_transfers.c`). */
int transfers_init(PyObject *module);
/* Adds `install_drive`, for the engine's block/wake path (`_drive.c`), to the module. */
int drive_init(PyObject *module);

#endif
