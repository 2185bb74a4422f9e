"""Published measurements of real training runs, as data: what ran (model, cluster, plan) and how long an
iteration took. `fidelity.py` predicts each one through `simulate()` and the built-in strategies.

Three sets, each from one cluster and one software stack:

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Tables 3 and 5:
  Megatron-LM on Selene (DGX A100 80GB, 8 HDR InfiniBand NICs a node), TP 8, deep pipelines, DP 1, full
  recompute or sequence parallelism with selective recompute; iteration times in seconds.
* Narayanan et al. 2021 (SC'21), "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", Table 1: weak scaling from 1.7B parameters on 32 GPUs to 1T on 3072, same cluster; the
  plans (TP, PP, microbatch, interleaving, full recompute, DDP flavour) are the paper's own scripts,
  NVIDIA/Megatron-LM examples/sc21/run_table_1.sh. The paper gives achieved teraFLOP/s per GPU; the
  iteration time is the FLOPs its Eq. 3 counts over that rate and the GPUs.
* Li et al. 2022 (NeurIPS), "AMP: Automatically Finding Model Parallel Strategies with Heterogeneity
  Awareness": 53 plans of one GPT-2 model run with DeepSpeed on one mixed AWS cluster (three p3.8xlarge,
  4 V100 16GB on NVLink and a 10 Gb/s NIC each, and one g4dn.12xlarge, 4 T4 on PCIe and a 50 Gb/s NIC),
  global batch 32; measured iteration times from the authors' repository (DachengLi1/AMP,
  src/results/het_cluster_results.txt, `r_cost`; plans that failed, `inf`, are left out).
* Qi, Wan, Huang and Lin 2024 (ICLR), "Zero Bubble (Almost) Pipeline Parallelism" (OpenReview tuzTN0eIO5;
  arXiv 2401.10241), Tables 3-6: four schedules of four GPT models, pipeline parallelism alone, run with the
  authors' Megatron-LM fork on up to 32 A100 SXM 80GB (8 a node, the nodes on a RoCE RDMA network);
  measured throughput in samples per GPU per second, and the bubble rates the paper computes from its
  profiled pass times.
"""

from __future__ import annotations

from dataclasses import dataclass

from dist_lib import Workload


@dataclass(frozen=True)
class MegatronRun:
    """One Megatron-LM run on Selene: the plan and its measured iteration time."""

    name: str
    workload: Workload
    gpus: int
    tp: int
    pp: int
    global_batch: int
    microbatch: int
    chunks: int  # interleaved model chunks per pipeline rank (1: plain 1F1B)
    selective_sp: bool  # sequence parallelism with selective recompute (else full recompute)
    overlap_grad_reduce: bool  # PyTorch DDP (overlapped buckets) rather than Megatron's local DDP
    measured_s: float
    # the backward's TP all-reduce of the input gradient runs beside the weight-gradient GEMMs: Megatron-LM
    # since 2 September 2021 (commits cf7efd4 and 3f65246, `async_tensor_model_parallel_allreduce`, on by
    # default), so in Korthikanti et al. 2022's runs; Narayanan et al. 2021 measured the code of spring 2021
    # (arXiv 2104.04473, April 2021; the sc21 scripts are of 10 August 2021 and predate the option), where it
    # ran after the backward GEMMs
    async_tp_allreduce: bool = True

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


def _gpt(name: str, layers: int, hidden: int, heads: int) -> Workload:
    return Workload(name, layers, hidden, heads, 2048, 51200)  # sequence 2048, vocabulary 51200 in both papers


GPT_22B, GPT_175B = _gpt("gpt-22b", 48, 6144, 64), _gpt("gpt-175b", 96, 12288, 96)
GPT_530B, GPT_1T = _gpt("gpt-530b", 105, 20480, 128), _gpt("gpt-1t", 128, 25600, 160)

# Korthikanti et al. 2022, Table 3 (plans; 3 interleaved chunks for 175B and 530B, as in the Calculon
# authors' validation files of the same table, calculon-ai/calculon validation/*.json) and Table 5
# (iteration time, s): (name, workload, GPUs, TP, PP, batch, microbatch, chunks, full recompute, SP + selective)
_TABLE5 = [
    ("22B", GPT_22B, 8, 8, 1, 4, 4, 1, 1.42, 1.10),
    ("175B", GPT_175B, 64, 8, 8, 64, 1, 3, 18.13, 13.75),
    ("530B", GPT_530B, 280, 8, 35, 280, 1, 3, 49.05, 37.83),
    ("1T", GPT_1T, 512, 8, 64, 512, 1, 1, 94.42, 71.49),
]
KORTHIKANTI_TABLE5 = [
    MegatronRun(name, workload, gpus, tp, pp, batch, micro, chunks, selective, False, seconds)
    for name, workload, gpus, tp, pp, batch, micro, chunks, full_s, sp_s in _TABLE5
    for selective, seconds in ((False, full_s), (True, sp_s))
]


def narayanan_iteration_time(workload: Workload, batch: int, gpus: int, tflops_per_gpu: float) -> float:
    """Narayanan et al. 2021, Eq. 3: an iteration with full recompute does
    96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs; at the achieved rate X per GPU on n GPUs it takes
    that over n X seconds."""
    s, l, h, v = workload.seq_len, workload.num_layers, workload.hidden, workload.vocab
    flops = 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    return flops / (gpus * tflops_per_gpu * 1e12)


# Narayanan et al. 2021, Table 1 (heads, hidden, layers, TP, PP, GPUs, batch, achieved teraFLOP/s per GPU) with
# run_table_1.sh's microbatch, DDP flavour (torch: overlapped; local: after the flush) and layers per virtual
# pipeline stage (76B 5, 145B 5, 310B 3, 530B 1: 3, 2, 2 and 3 chunks). Every run uses full recompute.
_TABLE1 = [  # name, heads, hidden, layers, TP, PP, GPUs, batch, microbatch, chunks, torch DDP, TFLOP/s
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 16, 1, True, 137),
    ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 16, 1, True, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 16, 1, True, 142),
    ("18B", 48, 6144, 40, 8, 1, 256, 1024, 8, 1, True, 135),
    ("39B", 64, 8192, 48, 8, 2, 512, 1536, 4, 1, False, 138),
    ("76B", 80, 10240, 60, 8, 4, 1024, 1792, 2, 3, False, 140),
    ("145B", 96, 12288, 80, 8, 8, 1536, 2304, 2, 2, False, 148),
    ("310B", 128, 16384, 96, 8, 16, 1920, 2160, 1, 2, False, 155),
    ("530B", 128, 20480, 105, 8, 35, 2520, 2520, 1, 3, False, 163),
    ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 1, 1, False, 163),
]
NARAYANAN_TABLE1 = [
    MegatronRun(name, workload, gpus, tp, pp, batch, micro, chunks, False, torch_ddp,
                narayanan_iteration_time(workload, batch, gpus, tflops), async_tp_allreduce=False)
    for name, heads, hidden, layers, tp, pp, gpus, batch, micro, chunks, torch_ddp, tflops in _TABLE1
    for workload in [_gpt(f"gpt-{name.lower()}", layers, hidden, heads)]
]


@dataclass(frozen=True)
class AmpPlan:
    """One plan AMP ran on its mixed cluster: microbatch, TP, DP, PP, the stage boundaries over AMP's 30
    pipeline slots (0 input, 1 embedding, 2-25 the 24 transformer layers, 26-29 head and loss), and the
    measured iteration time."""

    microbatch: int
    tp: int
    dp: int
    pp: int
    boundaries: tuple[int, ...]
    measured_s: float

    @property
    def partition(self) -> list[int]:
        """Transformer layers per stage."""
        first, last = 2, 25
        return [len(range(max(a, first), min(b, last + 1))) for a, b in zip(self.boundaries, self.boundaries[1:])]

    @property
    def name(self) -> str:
        return f"mb{self.microbatch} tp{self.tp} dp{self.dp} pp{self.pp}"


# AMP's profiles of one transformer layer's forward at microbatch 1 under DeepSpeed and Megatron-LM v1.1.5,
# ms, by device and TP degree: the mean over the 24 layers of src/known_cost/gpt2_{P3,G4}_{1,2,4}.npy
# (P3: the p3.8xlarge V100s, G4: the g4dn.12xlarge T4s; the TP all-reduces included).
AMP_LAYER_FORWARD_MS = {("V100-16GB", 1): 3.919, ("V100-16GB", 2): 5.243, ("V100-16GB", 4): 4.519,
                        ("T4", 1): 5.470, ("T4", 2): 5.962, ("T4", 4): 5.577}

# How AMP's runs time a layer pass (costs.forward_time: the longer of the host's time and the GPU's), each set
# from one of the profiles above (`python benchmarks/fidelity.py --calibrate`); the other profiles and the 43
# iteration times check them:
# * the GPU side: AMP's kernels take 2.267 times the kernel model's time, from the T4 TP-1 profile, which is
#   GPU-bound (the same layer runs faster on the V100, whose host time it then is);
# * the host side per layer pass: 3.919 ms, the V100 TP-1 profile, host-bound (its scaled kernels take 1.75 ms);
# * what a TP layer pass adds to the host side: 1.275 ms, from the V100 TP-2 profile less its all-reduces.
AMP_KERNEL_TIME_SCALE = 2.267
AMP_FRAMEWORK_OVERHEAD_S = 3919e-6
AMP_TP_OVERHEAD_S = 1275e-6

# The AMP model: GPT-2 with h 1024, s 1024, 24 layers, vocabulary 52256 (src/het_cluster.py); 16 heads as in
# its launch scripts (examples/ds_pretrain_gpt2_pipe.sh), fp16, gradients all-reduced in fp32
# (examples/ds_config.json: "fp32_allreduce": true).
AMP_GPT2 = Workload("amp-gpt2", 24, 1024, 16, 1024, 52256, framework_overhead_s=AMP_FRAMEWORK_OVERHEAD_S,
                    tp_overhead_s=AMP_TP_OVERHEAD_S, kernel_time_scale=AMP_KERNEL_TIME_SCALE,
                    grad_bytes_per_element=4)
AMP_BATCH = 32

_PP4, _PP8 = (0, 7, 14, 20, 30), (0, 5, 9, 12, 15, 18, 21, 24, 30)
_PP4B, _PP8B = (0, 8, 14, 20, 30), (0, 5, 8, 11, 14, 17, 20, 23, 30)
AMP_HET_CLUSTER = [  # in the order of the results file; measured r_cost, s
    AmpPlan(1, 1, 4, 4, _PP4, 1.47),
    AmpPlan(1, 1, 2, 8, _PP8, 1.28),
    AmpPlan(1, 1, 1, 16, (0, 3, 5, 7, 9, 11, 13, 15, 16, 17, 19, 20, 21, 22, 23, 25, 30), 1.52),
    AmpPlan(2, 1, 4, 4, _PP4, 1.53),
    AmpPlan(2, 1, 2, 8, (0, 5, 9, 12, 14, 17, 20, 23, 30), 1.54),
    AmpPlan(2, 1, 1, 16, (0, 3, 5, 7, 9, 11, 13, 14, 16, 18, 19, 20, 21, 23, 24, 25, 30), 1.58),
    AmpPlan(4, 1, 4, 4, (0, 6, 13, 20, 30), 1.71),
    AmpPlan(1, 1, 8, 2, (0, 14, 30), 2.23),
    AmpPlan(1, 2, 2, 4, _PP4B, 2.80),
    AmpPlan(4, 1, 2, 8, (0, 3, 7, 11, 14, 17, 20, 23, 30), 1.71),
    AmpPlan(1, 2, 1, 8, _PP8B, 3.81),
    AmpPlan(2, 1, 8, 2, (0, 14, 30), 2.26),
    AmpPlan(1, 2, 4, 2, (0, 14, 30), 2.89),
    AmpPlan(2, 2, 2, 4, _PP4B, 2.37),
    AmpPlan(4, 1, 8, 2, (0, 14, 30), 2.34),
    AmpPlan(2, 2, 1, 8, _PP8B, 3.36),
    AmpPlan(2, 2, 4, 2, (0, 14, 30), 2.50),
    AmpPlan(1, 2, 8, 1, (0, 30), 3.13),
    AmpPlan(2, 2, 8, 1, (0, 30), 3.06),
    AmpPlan(4, 2, 8, 1, (0, 30), 3.03),
    AmpPlan(1, 1, 16, 1, (0, 30), 2.90),
    AmpPlan(8, 1, 4, 4, _PP4B, 2.07),
    AmpPlan(4, 2, 4, 2, (0, 14, 30), 2.41),
    AmpPlan(4, 2, 2, 4, _PP4B, 1.65),
    AmpPlan(4, 2, 1, 8, _PP8B, 1.79),
    AmpPlan(1, 4, 4, 1, (0, 30), 3.80),
    AmpPlan(2, 4, 4, 1, (0, 30), 3.56),
    AmpPlan(4, 4, 4, 1, (0, 30), 3.29),
    AmpPlan(8, 4, 4, 1, (0, 30), 3.27),
    AmpPlan(2, 4, 2, 2, (0, 14, 30), 3.29),
    AmpPlan(2, 4, 1, 4, _PP4B, 3.92),
    AmpPlan(4, 4, 2, 2, (0, 14, 30), 2.66),
    AmpPlan(8, 2, 4, 2, (0, 14, 30), 2.45),
    AmpPlan(4, 4, 1, 4, _PP4B, 2.05),
    AmpPlan(8, 2, 2, 4, _PP4B, 1.91),
    AmpPlan(8, 4, 2, 2, (0, 14, 30), 2.71),
    AmpPlan(8, 2, 1, 8, _PP8B, 2.12),
    AmpPlan(8, 4, 1, 4, _PP4B, 2.13),
    AmpPlan(16, 4, 2, 2, (0, 14, 30), 2.66),
    AmpPlan(16, 2, 2, 4, _PP4B, 2.33),
    AmpPlan(16, 4, 1, 4, _PP4B, 2.49),
    AmpPlan(16, 2, 1, 8, _PP8B, 2.69),
    AmpPlan(32, 4, 1, 4, _PP4B, 3.13),
]

# The AMP cluster as AMP's own script describes it (src/het_cluster.py: three nodes at 10 Gb/s between nodes,
# one at 50 Gb/s) and AWS lists the instances: a p3.8xlarge has one 10 Gb/s NIC for its 4 NVLink V100s, a
# g4dn.12xlarge one 50 Gb/s NIC for its 4 T4s on PCIe. The p3.8xlarge nodes come first (ranks 0-11).
AMP_CLUSTER = {
    "name": "amp-3xp3.8xlarge+1xg4dn.12xlarge",
    "nodes": [
        {"device": "V100-16GB", "count": 3, "gpus": 4, "nics": 1, "nic_bandwidth_GBps": 10 / 8},
        {"device": "T4", "count": 1, "gpus": 4, "nics": 1, "nic_bandwidth_GBps": 50 / 8},
    ],
}


# ---- Qi et al. 2024, "Zero Bubble (Almost) Pipeline Parallelism", ICLR 2024 camera-ready (OpenReview
# tuzTN0eIO5, arXiv 2401.10241). Table 3: the models (sequence 1024, pipeline degree = GPUs, no TP or DP);
# sec. 5.1: "both the initial and final pipeline stages possess one fewer transformer layer compared to the
# intermediate stages" (22 layers on 8 stages: 2, 3 x 6, 2), and 1F1B-I runs one layer per chunk. The paper
# states no vocabulary: with the embedding counted once and 1024 learned positions the four model names hold
# for 25,014 to 33,464 tokens, and ZB_VOCAB is taken inside that range. No recompute is mentioned (the
# schedules keep activations; Table 4's memory grows with the schedule's in-flight microbatches).

ZB_VOCAB = 32000
ZB_SCHEDULES = ("1F1B", "1F1B-I", "ZB-1p", "ZB-2p")


@dataclass(frozen=True)
class ZeroBubbleModel:
    """One model of Qi et al. 2024 Table 3 and the GPUs (= pipeline stages) it ran on."""

    name: str
    workload: Workload
    gpus: int
    microbatch: int
    microbatch_counts: tuple[int, ...]

    @property
    def partition(self) -> list[int]:
        """Layers per stage: the first and last stage one fewer than the others (sec. 5.1)."""
        inner = (self.workload.num_layers + 2) // self.gpus
        return [inner - 1] + [inner] * (self.gpus - 2) + [inner - 1]


def _zb_model(name: str, layers: int, heads: int, hidden: int, gpus: int, microbatch: int,
              counts: tuple[int, ...]) -> ZeroBubbleModel:
    return ZeroBubbleModel(name, Workload(f"zb-{name.lower()}", layers, hidden, heads, 1024, ZB_VOCAB), gpus,
                           microbatch, counts)


ZB_MODELS = [  # Table 3: layers, heads, hidden, GPUs, microbatch size, numbers of microbatches
    _zb_model("1.5B", 22, 24, 2304, 8, 6, (24, 32, 64)),
    _zb_model("6.2B", 30, 32, 4096, 8, 3, (24, 32, 64)),
    _zb_model("14.6B", 46, 40, 5120, 16, 1, (48, 64, 128)),
    _zb_model("28.3B", 62, 48, 6144, 32, 1, (96, 128, 256)),
]

# Table 4: samples per GPU per second, in the order of each model's microbatch counts
ZB_THROUGHPUT = {
    "1.5B": {"ZB-2p": (14.5, 14.8, 14.9), "ZB-1p": (12.9, 13.4, 14.2), "1F1B": (11.8, 12.5, 13.6),
             "1F1B-I": (13.1, 13.4, 13.9)},
    "6.2B": {"ZB-2p": (4.32, 4.35, 4.39), "ZB-1p": (3.88, 4.00, 4.20), "1F1B": (3.50, 3.70, 4.03),
             "1F1B-I": (4.01, 4.08, 4.19)},
    "14.6B": {"ZB-2p": (1.81, 1.83, 1.85), "ZB-1p": (1.61, 1.67, 1.76), "1F1B": (1.40, 1.49, 1.64),
              "1F1B-I": (1.54, 1.59, 1.66)},
    "28.3B": {"ZB-2p": (0.99, 1.00, 1.00), "ZB-1p": (0.87, 0.90, 0.96), "1F1B": (0.76, 0.80, 0.88),
              "1F1B-I": (0.82, 0.85, 0.90)},
}

# Table 5: bubble rates the paper computes, not measures, as (cost - m (T_F + T_B + T_W)) / cost with cost the
# longest stage's time from the profiled pass times of Table 6; ZB-H1 and ZB-1p agree on every row
ZB_BUBBLE_SCHEDULES = ("1F1B", "1F1B-I", "ZB-H1", "ZB-H2", "ZB-1p", "ZB-2p")
ZB_BUBBLE_RATES = {
    ("1.5B", 24): (0.2431, 0.1055, 0.1585, 0.1083, 0.1585, 0.0433),
    ("1.5B", 32): (0.1985, 0.0818, 0.1242, 0.0837, 0.1242, 0.0039),
    ("1.5B", 64): (0.1240, 0.0443, 0.0674, 0.0444, 0.0674, 0.0026),
    ("6.2B", 24): (0.2347, 0.0808, 0.1323, 0.0698, 0.1323, 0.0029),
    ("6.2B", 32): (0.1898, 0.0628, 0.1045, 0.0559, 0.1045, 0.0022),
    ("6.2B", 64): (0.1091, 0.0320, 0.0554, 0.0294, 0.0554, 0.0010),
    ("14.6B", 48): (0.2552, 0.1104, 0.1397, 0.0672, 0.1397, 0.0066),
    ("14.6B", 64): (0.2082, 0.0852, 0.1088, 0.0516, 0.1088, 0.0054),
    ("14.6B", 128): (0.1251, 0.0445, 0.0576, 0.0266, 0.0576, 0.0028),
    ("28.3B", 96): (0.2646, 0.1493, 0.1421, 0.0641, 0.1421, 0.0038),
    ("28.3B", 128): (0.2168, 0.1164, 0.1106, 0.0490, 0.1106, 0.0029),
    ("28.3B", 256): (0.1352, 0.0624, 0.0594, 0.0257, 0.0594, 0.0018),
}

# Table 6: profiled T_F, T_B (input gradient), T_W, T_comm in ms, recorded in ZB-2p at the smallest
# microbatch count (its other rows in Table 6 differ by under 3 % in T_F, T_B and T_W)
ZB_PROFILED_MS = {"1.5B": (18.522, 18.086, 9.337, 0.601), "6.2B": (29.718, 29.444, 19.927, 0.527),
                  "14.6B": (11.347, 11.248, 8.132, 0.377), "28.3B": (10.419, 10.207, 7.715, 0.408)}


@dataclass(frozen=True)
class ZeroBubbleRun:
    """One cell of Table 4: a model, a number of microbatches, a schedule and its measured throughput."""

    model: ZeroBubbleModel
    microbatches: int
    schedule: str
    samples_per_gpu_s: float

    @property
    def global_batch(self) -> int:
        return self.microbatches * self.model.microbatch

    @property
    def measured_s(self) -> float:
        """The iteration time the throughput implies: the batch over (samples per GPU per second x GPUs)."""
        return self.global_batch / (self.samples_per_gpu_s * self.model.gpus)


ZERO_BUBBLE_TABLE4 = [
    ZeroBubbleRun(model, m, schedule, ZB_THROUGHPUT[model.name][schedule][i])
    for model in ZB_MODELS for i, m in enumerate(model.microbatch_counts) for schedule in ZB_SCHEDULES
]
