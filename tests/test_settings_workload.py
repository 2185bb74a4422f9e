"""`run --from` keeps the architecture of the workload given and changes only what the framework's settings
change (`workload.transformer.override_spec`): a torchtitan config's sequence length, Megatron-LM's model flags."""

import pytest

from dist_lib import SpecError, Workload
from dist_lib.workload.transformer import override_spec
from grader.launch_cli import settings_run


def test_an_override_spec_reads_back_as_the_changed_workload():
    base = Workload.load("llama-3-8b:layers=4")
    changed = Workload.load("llama-3-8b:layers=4,seq=65536,kernels=eager")
    spec = override_spec("llama-3-8b:layers=4", base, changed)
    assert spec == "llama-3-8b:layers=4,seq=65536,kernels=eager"
    assert Workload.parse(spec) == changed
    assert override_spec("llama-3-8b:layers=4", base, base) == "llama-3-8b:layers=4"
    moe = Workload.load("mixtral-8x7b")
    with pytest.raises(SpecError, match="cannot be written as a spec's overrides"):
        override_spec("llama-3-8b:layers=4", base, moe)


def test_a_torchtitan_config_keeps_the_llama_block_at_its_own_sequence(tmp_path):
    config = tmp_path / "job.toml"
    config.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 65536\n'
                      '[parallelism]\ncontext_parallel_degree = 2\n[activation_checkpoint]\nmode = "full"\n')
    _, options, spec, batch = settings_run("torchtitan", str(config), "1x8xH100-80GB", "llama-3-8b")
    # GQA, SwiGLU and RMSNorm stay (a GPT-style toy of the same width had been simulated, its 65,536-token
    # attention unfused)
    assert spec == "llama-3-8b:seq=65536"
    assert options["cp"] == 2 and options["fsdp"] is True and batch == 4  # dp_shard 4 x local batch 1
