"""The machines: device figures (`devices`), nodes, links and clusters (`cluster`), where a group sits
(`topology`), and measured per-layer costs read from profile files (`profiles`, `metis`)."""
