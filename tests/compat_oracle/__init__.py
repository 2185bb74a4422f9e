"""A small reimplementation of the ORIGINAL puzzles and course-lab libraries, written from reading them,
used only as a test oracle: same cost models, memory sums, one-message mailboxes and gradient rules,
with an event-driven barrier instead of a polling one and a hang detector instead of hanging."""
