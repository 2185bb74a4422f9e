"""What is trained: a transformer's shape and the presets (`transformer`), mixture-of-experts layers (`moe`,
`moe_presets`) and how tokens spread over the experts (`routing`)."""

from dist_lib.workload import moe_presets  # noqa: F401  (registers the MoE presets)
