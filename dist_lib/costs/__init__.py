"""The cost model: every duration in the simulator. Compute passes on a device (`compute`), collectives and
messages on links (`network`), and what each op of a rank costs (`ops`). Nothing here knows about ranks,
clocks or tensors: callers pass the device or link and the sizes."""
