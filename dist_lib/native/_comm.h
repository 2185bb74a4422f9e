/* What the C twins of the collective path share: `_comm_ops.c` (a member's issue), `_comm_resolve.c` (a
 * collective every member issued: `comm._resolve_ready`), `_comm_end.c` (its start and end on the group's
 * stream: `comm._start`, `comm._finish`) and `_work.c` (awaiting a finished Work: `Work._complete`). */
#ifndef DIST_LIB_COMM_H
#define DIST_LIB_COMM_H

#include "_ops.h"

/* Put the C start and end of a collective in comm._start and comm._finish (their Python twins stay in
 * comm.PYTHON_TWINS). 0, or -1 with an exception. */
int install_comm_end(PyObject *comm, PyObject *RankState);
/* Put the C resolution in comm._resolve_ready (its Python twin stays in comm.PYTHON_TWINS); needs
 * `install_comm_end` first. 0, or -1 with an exception. */
int install_comm_resolve(PyObject *comm);
/* Put the C `Work._complete` on comm.Work (its Python twin joins comm.PYTHON_TWINS as "Work._complete"). 0,
 * or -1 with an exception. */
int install_work(PyObject *comm, PyObject *RankState, PyObject *MemoryTracker);
/* `comm._start(engine, coll)` (C, or the Python for an unusual collective): None, or NULL with an exception. */
PyObject *comm_start(PyObject *engine, PyObject *coll);
/* `comm._resolve_ready(engine, coll)` (C, or the Python for an unusual collective and every error): None,
 * or NULL with an exception. */
PyObject *comm_resolve_ready(PyObject *engine, PyObject *coll);

#endif
