"""Communication: groups and collectives (`collectives`), what a collective makes of its inputs
(`rules`), and point-to-point messages (`p2p`)."""
