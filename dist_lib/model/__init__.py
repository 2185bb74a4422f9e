"""The per-rank handle a strategy drives (`handle.Model`), the checks each op makes of its tensors
(`op_checks`), and the end-of-step correctness check (`correctness`)."""

from dist_lib.model.accelerated import install_c_twins

install_c_twins()
