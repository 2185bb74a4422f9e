"""benchmarks/fidelity.py: Korthikanti et al. 2022 Table 4 and the Table 5 cross-check, the published sets' derived
figures, the rank correlation, and the Megatron pipeline programs of the cross-check."""

from __future__ import annotations

import importlib.util
import sys
from types import SimpleNamespace
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "fidelity.py"
_spec = importlib.util.spec_from_file_location("fidelity", _PATH)
fidelity = importlib.util.module_from_spec(_spec)
sys.modules["fidelity"] = fidelity  # dataclasses look their module up by name
_spec.loader.exec_module(fidelity)  # puts the repository root on sys.path

from benchmarks import megatron_pipeline as pipeline  # noqa: E402
from benchmarks import published  # noqa: E402


def test_catalog_constants_are_the_ones_their_published_points_give():
    calibrated = fidelity.calibrate()
    assert calibrated["A100-80GB max_efficiency"] == fidelity.A100.max_efficiency
    assert calibrated["V100 max_efficiency"] == fidelity.DEVICES["V100-16GB"].max_efficiency
    assert calibrated["T4 max_efficiency"] == fidelity.DEVICES["T4"].max_efficiency
    for key, name in (("L40S", "L40S-48GB"), ("A10G", "A10G-24GB"), ("L4", "L4"), ("P100", "P100-16GB")):
        assert calibrated[f"{key} max_efficiency"] == fidelity.DEVICES[name].max_efficiency
    assert calibrated["AMP kernel time scale"] == published.AMP_KERNEL_TIME_SCALE
    assert calibrated["AMP framework overhead per layer pass (s)"] == published.AMP_FRAMEWORK_OVERHEAD_S
    assert calibrated["AMP extra overhead per TP layer pass (s)"] == published.AMP_TP_OVERHEAD_S


def test_amp_layer_profiles_outside_the_calibration_are_predicted_within_twenty_percent():
    # V100 TP 1 and 2 and T4 TP 1 set the host time, the TP host time and the kernel scale; the rest check them
    checks = [row for row in fidelity.amp_layer_forwards() if row[:2] not in
              {("V100-16GB", 1), ("V100-16GB", 2), ("T4", 1)}]
    assert len(checks) == 3
    for name, tp, measured, predicted in checks:
        assert predicted == pytest.approx(measured, rel=0.20), (name, tp)


def test_amp_measured_best_plan_is_the_simulated_best():
    times = {plan.name: fidelity.predict_amp(plan).time_s for plan in published.AMP_HET_CLUSTER}
    best_measured = min(published.AMP_HET_CLUSTER, key=lambda plan: plan.measured_s)
    assert min(times, key=times.get) == best_measured.name == "mb1 tp1 dp2 pp8"


def test_table_4_layer_times_within_five_percent():
    for name, forward, f, backward, b in fidelity.table4():
        assert abs(f / forward - 1) < 0.05, name
        assert abs(b / backward - 1) < 0.05, name


def _composed(run):
    return pipeline.compose(run.workload, run.gpus, run.tp, run.pp, run.global_batch, run.microbatch, run.chunks,
                            run.selective_sp, fidelity.A100)


def test_composed_table_5_mean_error_under_five_and_every_row_under_ten_percent():
    errors = [abs(_composed(run) / run.measured_s - 1) for run in published.KORTHIKANTI_TABLE5]
    assert max(errors) < 0.10
    assert sum(errors) / len(errors) < 0.05


def test_simulated_22b_rows_agree_with_the_composition_of_the_same_formulas():
    for run in published.KORTHIKANTI_TABLE5[:2]:
        assert fidelity.predict_megatron(run).time_s == pytest.approx(_composed(run), rel=0.08), run.name


@pytest.mark.slow
def test_simulated_table_5_mean_error_at_most_four_and_every_row_at_most_eight_percent():
    # every row through simulate("strategies/hybrid.py"), rank for rank (a few minutes)
    errors = [abs(fidelity.predict_megatron(run).time_s / run.measured_s - 1) for run in published.KORTHIKANTI_TABLE5]
    assert max(errors) <= 0.08
    assert sum(errors) / len(errors) <= 0.04


def test_the_megatron_version_of_each_set_decides_whether_the_tp_all_reduce_overlaps_the_backward():
    # async_tensor_model_parallel_allreduce reached Megatron-LM in September 2021: after Narayanan et al.
    # 2021's measurements, before Korthikanti et al. 2022's
    assert {run.async_tp_allreduce for run in published.KORTHIKANTI_TABLE5} == {True}
    assert {run.async_tp_allreduce for run in published.NARAYANAN_TABLE1} == {False}
    assert fidelity.megatron_plan(published.NARAYANAN_TABLE1[4])["async_tp_allreduce"] is False


def test_narayanan_iteration_time_is_equation_3_over_the_achieved_rate():
    # 1.7B: 96 * 512 * 2048 * 24 * 2304^2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304)) FLOPs
    # over 32 GPUs at 137 TFLOP/s
    flops = 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / 13824 + 51200 / 884736)
    assert published.NARAYANAN_TABLE1[0].measured_s == pytest.approx(flops / (32 * 137e12))


def test_amp_stage_boundaries_count_transformer_layers():
    # slots 0 input, 1 embedding, 2-25 layers, 26-29 head: [0, 7) holds layers 2-6, [20, 30) layers 20-25
    plan = published.AmpPlan(1, 1, 4, 4, (0, 7, 14, 20, 30), 1.0)
    assert plan.partition == [5, 7, 6, 6]
    assert all(sum(p.partition) == 24 for p in published.AMP_HET_CLUSTER)


def test_spearman_is_the_rank_correlation():
    # ranks 1 2 3 4 against 1 3 2 4: 1 - 6 * (0 + 1 + 1 + 0) / (4 * 15) = 0.8; ties share their mean rank
    assert fidelity.spearman([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert fidelity.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert fidelity.spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)


@pytest.mark.parametrize("p, m, v", [(2, 4, 1), (4, 8, 1), (4, 3, 1), (2, 4, 2), (4, 8, 2), (3, 6, 2), (4, 8, 3),
                                     (4, 4, 2)])
def test_megatron_programs_match_every_send_with_a_receive_and_finish(p, m, v):
    programs = pipeline.megatron_programs(p, m, v)
    sent: dict[tuple, int] = {}
    for rank, program in enumerate(programs):
        computes = [s for s in program if isinstance(s, pipeline.Compute)]
        assert sorted(s.kind for s in computes) == ["B"] * m * v + ["F"] * m * v
        for step in program:
            if isinstance(step, pipeline.Exchange):
                for what in step.sends:
                    dst = (rank + 1) % p if what == pipeline.ACT else (rank - 1) % p
                    sent[(rank, dst, what)] = sent.get((rank, dst, what), 0) + 1
                for what in step.recvs:
                    src = (rank - 1) % p if what == pipeline.ACT else (rank + 1) % p
                    sent[(src, rank, what)] = sent.get((src, rank, what), 0) - 1
    assert all(count == 0 for count in sent.values())
    assert len(pipeline.run(programs, lambda r, s: 1.0, lambda a, b: 0.1)) == p


def test_one_f_one_b_with_free_messages_takes_m_plus_p_minus_1_slots():
    # F = 1, B = 2 on every stage and free exchanges: the first stage finishes after
    # (m + p - 1) * (F + B) = (8 + 3) * 3 = 33
    programs = pipeline.megatron_programs(4, 8, 1)
    ends = pipeline.run(programs, lambda r, s: 1.0 if s.kind == "F" else 2.0, lambda a, b: 0.0)
    assert max(ends) == pytest.approx(33.0)


def test_blocking_exchange_holds_the_sender_until_the_receiver_is_there():
    # two stages, one microbatch: stage 0 runs F (1) and sends; stage 1 posts its receive at once, so
    # the send ends at 1 + 0.5; stage 1 runs F and B (3), sends the gradient back at 4.5 + 0.5 = 5, and
    # stage 0, waiting for it since 1.5, runs B (2): 7
    programs = pipeline.megatron_programs(2, 1, 1)
    ends = pipeline.run(programs, lambda r, s: 1.0 if s.kind == "F" else 2.0, lambda a, b: 0.5)
    assert ends == [pytest.approx(7.0), pytest.approx(5.0)]


# ---- Qi et al. 2024, Zero Bubble Pipeline Parallelism ------------------------------------------------------

def test_zero_bubble_set_holds_table_4_cell_for_cell():
    # four models x three microbatch counts x four schedules; 1.5B has 22 layers on 8 stages, the first and
    # last one fewer (sec. 5.1): 2 + 6 x 3 + 2; 28.3B has 62 on 32: 1 + 30 x 2 + 1
    assert len(published.ZERO_BUBBLE_TABLE4) == 48
    assert [m.partition for m in published.ZB_MODELS][0] == [2, 3, 3, 3, 3, 3, 3, 2]
    assert published.ZB_MODELS[3].partition == [1] + [2] * 30 + [1]
    assert all(sum(m.partition) == m.workload.num_layers and len(m.partition) == m.gpus
               for m in published.ZB_MODELS)
    # 1.5B, 24 microbatches of 6 on 8 GPUs at 11.8 samples per GPU per second (1F1B): 144 / (11.8 x 8) s
    run = published.ZERO_BUBBLE_TABLE4[0]
    assert (run.model.name, run.microbatches, run.schedule) == ("1.5B", 24, "1F1B")
    assert run.measured_s == pytest.approx(144 / (11.8 * 8))
    # Table 5 computes the same bubble for ZB-H1 and ZB-1p in all twelve settings, which is why ZB-1p's
    # measured throughput stands for the 1F1B-memory zero-bubble schedule
    h1, zb1 = published.ZB_BUBBLE_SCHEDULES.index("ZB-H1"), published.ZB_BUBBLE_SCHEDULES.index("ZB-1p")
    assert len(published.ZB_BUBBLE_RATES) == 12
    assert all(rates[h1] == rates[zb1] for rates in published.ZB_BUBBLE_RATES.values())


def test_zero_bubble_vocabulary_keeps_the_four_model_names():
    # names rounded to 0.1B: layers 12h^2 + 13h, final layernorm 2h, 1024 learned positions, embedding once
    for model in published.ZB_MODELS:
        w = model.workload
        params = w.num_layers * (12 * w.hidden ** 2 + 13 * w.hidden) + 2 * w.hidden + (1024 + w.vocab) * w.hidden
        assert f"{params / 1e9:.1f}B" == model.name


def test_zero_bubble_plans_use_the_built_in_schedules():
    model = published.ZB_MODELS[0]
    runs = {r.schedule: r for r in published.ZERO_BUBBLE_TABLE4 if r.model is model and r.microbatches == 24}
    zb1, zb2 = fidelity.zerobubble_plan(runs["ZB-1p"])[1], fidelity.zerobubble_plan(runs["ZB-2p"])[1]
    assert (zb1["max_in_flight"], zb2["max_in_flight"]) == (8, 16)
    # the runtime's memory count: a W holds 32h of 34h + 5as bytes a token, 73,728 of 201,216 at h 2304, a 24
    assert zb2["w_share"] == pytest.approx(73728 / 201216)
    assert (zb2["objective"], zb2["uniform_times"]) == ("span", True)
    strategy, options = fidelity.zerobubble_plan(runs["1F1B-I"])
    # one layer a chunk of 22 padded to 24: three chunks a stage, stage 0's first and stage 7's last empty
    assert (strategy, options["chunks"]) == ("interleaved.py", 3)
    assert options["partition"] == [range(0, 0)] + [range(k, k + 1) for k in range(22)] + [range(22, 22)]
    deep = [r for r in published.ZERO_BUBBLE_TABLE4 if r.model.name == "28.3B" and r.schedule == "1F1B-I"]
    for run in deep:  # 62 layers padded to 64 on 32 stages: two chunks, blocks 0 and 63 empty
        strategy, options = fidelity.zerobubble_plan(run)
        assert options["chunks"] == 2 and len(options["partition"]) == 64
        assert [len(block) for block in options["partition"]] == [0] + [1] * 62 + [0]


def test_only_the_zero_bubble_runs_overlap_their_steps():
    # post-validation is on for the ZB schedules alone; a step overlapping the next one lasts its longest rank
    # span: rank 0 computes from 1 to 4, rank 1 from 2 to 5 and sends until 7: spans 3 and 5
    assert [fidelity.overlaps_steps(s) for s in published.ZB_SCHEDULES] == [False, False, True, True]
    events = [(0, "forward", "compute", 1.0, 4.0), (1, "forward", "compute", 2.0, 5.0),
              (1, "send", "p2p", 5.0, 7.0), (0, "update", "compute", 3.0, 3.5)]
    result = SimpleNamespace(cluster=SimpleNamespace(world_size=2), raw_events=events, time_s=7.0)
    assert fidelity.steady_period(result) == pytest.approx(5.0)


def test_zero_bubble_1f1b_row_is_the_slowest_stage_times_the_microbatches():
    # 1F1B with free messages: every stage's F + B once (fill and drain) plus m - 1 more of the slowest
    # stage's (the last: 2 layers and the LM head); messages and the optimizer add under 2 %
    run = published.ZERO_BUBBLE_TABLE4[0]
    model, b = run.model, run.model.microbatch
    w, a100, costs = model.workload, fidelity.A100, fidelity.costs
    stages = [n * (costs.forward_time(a100, w, 1, b) + costs.backward_time(a100, w, 1, b)) for n in model.partition]
    stages[-1] += costs.loss_time(a100, w, b)
    expected = sum(stages) + (run.microbatches - 1) * max(stages)
    assert fidelity.predict_zerobubble(run).time_s == pytest.approx(expected, rel=0.02)
