"""The grader: run strategy files on scenarios, rank them, and report."""
