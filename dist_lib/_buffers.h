/* What `_buffers.c` (buffers and their log) and `_ops.c` (the hottest ops) share. */
#ifndef DIST_LIB_BUFFERS_H
#define DIST_LIB_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

#define KIND_MASK 7 /* low bits of a tag: the kind code (memory.KIND_BITS) */

typedef struct {
    PyObject_HEAD
    PyObject *owner; /* whose `clock` stamps the log */
    long long live;
    long long peak;
    long long capacity;
    Py_ssize_t peak_index; /* entries up to and including the peak */
    char enforce;
    Py_ssize_t len, cap;
    double *times;
    long long *deltas;
    long long *tags; /* buffer address | kind code */
} AllocLog;

/* Two words after the object header, as every live tensor is one: what the buffer hangs on, and its
 * size, kind and whether it is a view. Its log tag is the owner's address | kind code. */
typedef struct {
    PyObject_HEAD
    PyObject *ref;           /* the AllocLog it was allocated on; for a view, the owning Buffer */
    unsigned long long word; /* nbytes | kind code << CODE_SHIFT | VIEW */
} Buffer;

#define CODE_SHIFT 56
#define NBYTES_MASK ((1ULL << CODE_SHIFT) - 1)
#define VIEW (1ULL << 63)
#define BUFFER_NBYTES(b) ((long long)((b)->word & NBYTES_MASK))
#define BUFFER_CODE(b) ((long long)(((b)->word >> CODE_SHIFT) & KIND_MASK))

extern PyTypeObject AllocLogType;
extern PyTypeObject BufferType;

/* The owner's clock, or -1 with an exception set. */
double log_clock(AllocLog *log);
/* Read clocks of owners of this type straight from this slot (set once the class is known). */
void set_clock_slot(PyTypeObject *type, Py_ssize_t offset);
/* type(log, nbytes, *fields) and type(tensor, nbytes, *fields) without building an argument tuple. */
PyObject *buffer_alloc(PyTypeObject *type, AllocLog *log, long long nbytes, PyObject *const *fields, Py_ssize_t n);
PyObject *buffer_view(PyTypeObject *type, PyObject *source, PyObject *const *fields, Py_ssize_t n);

/* Adds the hot ops' `install` to the module (`_ops.c`). */
int ops_init(PyObject *module);

#endif
