"""Lifetime-based memory accounting: buffers whose bytes count from creation until their last reference
dies (`buffers`, the Python twin of the C `Buffer`), and each rank's log, peaks and out-of-memory
(`tracker`)."""
