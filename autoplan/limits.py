"""The largest sizes autoplan accepts, in one place, each with the reason for its value.

Every size a schema or a command-line option takes is bounded so that any input autoplan
accepts is handled in bounded time and memory, and every figure derived from it stays a finite
float. The limits sit well above the largest real deployments (clusters of ~100k GPUs, context
windows of ~1M tokens, models of a few hundred layers), so they refuse typing mistakes and
hostile files, never real work. An input over a limit is refused with one line naming the
field, its value and the limit.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_HOST_LINK_GB_PER_S",
    "DEFAULT_HOST_MEMORY_GIB_PER_GPU",
    "GIB",
    "MAX_BANDWIDTH_GB_PER_S",
    "MAX_CLUSTER_GPUS",
    "MAX_CLUSTER_NODES",
    "MAX_CPUS_PER_TASK",
    "MAX_FILE_FLOAT",
    "MAX_FILE_INT",
    "MAX_GLOBAL_BATCH_SIZE",
    "MAX_GPUS_PER_NODE",
    "MAX_GPU_TYPES",
    "MAX_INPUT_FILE_BYTES",
    "MAX_INTER_NODE_LINKS",
    "MAX_LATENCY_US",
    "MAX_LAYERS",
    "MAX_MEASURED_ENTRIES",
    "MAX_MEMORY_GIB",
    "MAX_MICRO_BATCH_SIZE",
    "MAX_NAME_LENGTH",
    "MAX_NESTING_DEPTH",
    "MAX_NODE_GROUPS",
    "MAX_NUM_MICRO_BATCHES",
    "MAX_OVERHEAD_MS",
    "MAX_PEAK_TFLOPS",
    "MAX_PIPELINE_DEGREE",
    "MAX_PRICE_USD_PER_HOUR",
    "MAX_SEQ_LEN",
    "MAX_SIMULATED_ACTIONS",
    "MAX_STEPS",
    "MAX_SWEEP_CONFIGURATIONS",
    "MAX_TIME_LIMIT_S",
    "MAX_TOP_K",
    "MAX_TRAIN_TOKENS",
    "MAX_VIRTUAL_STAGES",
    "MAX_YAML_ALIASES",
    "MIN_BANDWIDTH_GB_PER_S",
    "MIN_MEMORY_GIB",
    "MIN_PEAK_TFLOPS",
]

# Bytes in a GiB: the unit of every *_gib field and limit (memory sizes as GPU vendors quote them).
GIB = 1024**3

# --- Files -----------------------------------------------------------------------------------

MAX_INPUT_FILE_BYTES = 128 * 2**20
"""128 MiB per file read. The largest shipped profile is ~170 kB and a plan of a 100k-GPU
cluster is a few tens of MB; parsing and validating 128 MiB takes seconds, not minutes."""

MAX_NESTING_DEPTH = 64
"""Containers inside containers. autoplan's files nest at most ~8 deep; 64 leaves room and
refuses pathological nesting before any recursive parser or validator meets it."""

MAX_YAML_ALIASES = 1000
"""YAML alias references (``*name``) per file. Cluster files use a few anchors at most; a cap
stops 'billion laughs' files whose aliases expand exponentially when walked."""

MAX_FILE_INT = 10**24
"""Largest integer magnitude in any file. Per-layer FLOPs of a 1T-parameter model at a 1M-token
context are ~1e19; 1e24 is far above any real count of FLOPs, bytes or parameters and far below
float's range, so sums and products over layers and micro-batches stay finite."""

MAX_FILE_FLOAT = 1e30
"""Largest float magnitude in any file (non-finite numbers are refused too): FLOPs per iteration
of the largest models are ~1e24; 1e30 keeps every derived figure finite."""

# --- Names -----------------------------------------------------------------------------------

MAX_NAME_LENGTH = 64
"""Characters in a name (cluster, node group, GPU type): names become file names, host-list
lookups and Slurm job fields; 64 is ample for 'A100-80GB' or 'rack12-h100'."""

# --- Clusters --------------------------------------------------------------------------------

MAX_NODE_GROUPS = 256
"""Node groups per cluster: a group is a kind of node (GPU type, count); real clusters have a
handful; 256 allows one group per rack of a very large machine."""

MAX_GPU_TYPES = 256
"""GPU types a cluster file may define under ``gpu_types``."""

MAX_INTER_NODE_LINKS = 1024
"""Faster inter-node links declared per cluster (racks, pods)."""

MAX_GPUS_PER_NODE = 128
"""GPUs per node: 8 on an HGX board, 72 in one NVLink domain of a GB200 NVL72 rack modelled as
one node; 128 leaves room."""

MAX_CLUSTER_NODES = 65_536
"""Nodes per cluster (all groups together): the largest training clusters have ~25k nodes."""

MAX_CLUSTER_GPUS = 262_144
"""GPUs per cluster: ~2.5x the largest clusters built (about 100k GPUs)."""

MIN_BANDWIDTH_GB_PER_S = 1e-3
"""Slowest link or memory accepted, GB/s (1 MB/s): anything slower is a typing mistake, and
dividing bytes by a near-zero bandwidth would give infinite times."""

MAX_BANDWIDTH_GB_PER_S = 1e12
# A GPU type without a host-link figure: PCIe gen4 x16 at its effective ~25 GB/s per direction.
DEFAULT_HOST_LINK_GB_PER_S = 25.0
# A GPU type without a host-memory figure: 512 GB over 8 GPUs (a DGX-1's share, the smallest
# of the 8-GPU servers in the catalog's sources).
DEFAULT_HOST_MEMORY_GIB_PER_GPU = 64.0
"""Fastest link or memory accepted, GB/s: far beyond any hardware (HBM3e is ~5e3), because
what-if studies and oracle tests model 'free' communication as 1e9 to 1e12 GB/s; any finite
bound keeps times finite."""

MAX_LATENCY_US = 1e7
"""Largest per-message latency, microseconds (10 s)."""

MIN_MEMORY_GIB = 2**-10
"""Smallest device memory, GiB (1 MiB): test fixtures use fractions of a GiB."""

MAX_MEMORY_GIB = 1e5
"""Largest device memory, GiB (~100 TB; a GH200 has 576 GB of CPU+GPU memory)."""

MIN_PEAK_TFLOPS = 1e-6
"""Smallest peak TFLOP/s of a dtype (1 MFLOP/s): slower would give times of years."""

MAX_PEAK_TFLOPS = 1e6
"""Largest peak TFLOP/s of a dtype (~500x an H100's dense bf16)."""

MAX_OVERHEAD_MS = 1e6
"""Largest fixed per-pass or per-step overhead, ms (~17 minutes)."""

# --- Models, batches, pipelines --------------------------------------------------------------

MAX_MEASURED_ENTRIES = 4096
"""Measured times per layer: one per (device, tp, micro-batch size); a sweep of 16 GPU types ×
4 tp degrees × 16 micro-batch sizes is 1,024, and the shared calibration table gives 129."""

MAX_LAYERS = 4096
"""Pipeline layers per model: the largest published dense models have ~130 blocks."""

MAX_SEQ_LEN = 2**20
"""Tokens per sample (1M): the longest context windows trained today."""

MAX_MODEL_WIDTH = 2**22
"""Largest width a model config may state (hidden, MLP, heads, vocabulary: 4M). Published
models stay under 300k (Gemma's 256k vocabulary); a config beyond this is a typo or hostile."""

MAX_MODEL_PATH_LENGTH = 4096
"""Characters of the path in an 'hf:PATH' model name (Linux's PATH_MAX)."""

MAX_GLOBAL_BATCH_SIZE = 2**24
"""Samples per iteration (16M): BERT-style runs use 64k; 16M samples of even 1 token each."""

MAX_MICRO_BATCH_SIZE = 2**16
"""Samples per micro-batch (65,536)."""

MAX_NUM_MICRO_BATCHES = 2**16
"""Micro-batches per iteration (65,536): pipelines use up to a few thousand."""

MAX_PIPELINE_DEGREE = 1024
"""Pipeline ranks (the solver's space goes to 128)."""

MAX_VIRTUAL_STAGES = 64
"""Stages per pipeline rank under interleaved 1F1B (Megatron uses 2 to 8)."""

MAX_SIMULATED_ACTIONS = 200_000
"""Forward and backward actions ``autoplan simulate`` plays (2 x micro-batches x stages): about
5 s of simulation on one core, and a timeline still readable. Larger plans are valid; simulate
refuses them with one line (fewer micro-batches give the same per-micro-batch picture)."""

# --- Command-line options --------------------------------------------------------------------

MAX_STEPS = 10**9
"""Training steps of ``run``/``launch``."""

MAX_TOP_K = 100
"""Alternatives ``solve`` keeps."""

MAX_TIME_LIMIT_S = 86_400.0
"""Seconds ``solve`` may search (one day)."""

MAX_CPUS_PER_TASK = 4096
"""CPUs one Slurm task (one node's torchrun) may request."""

MAX_SWEEP_CONFIGURATIONS = 256
"""Configurations (node counts × global batches) of one ``sweep``: each is a whole solve, up to
its time limit; a longer list is more likely a typing mistake than a plan."""

MAX_TRAIN_TOKENS = 1e18
"""Tokens ``sweep`` prices a run for: the largest published runs train on ~1e14 tokens."""

MAX_PRICE_USD_PER_HOUR = 1e4
"""US dollars per GPU-hour ``sweep`` takes: cloud prices are ~0.1 to 100."""
