"""What every command checks in a plan before using it, beyond its schema: the validator's rules
(``autoplan.plan.validate``) and a few of autoplan's own that guard the commands themselves.

Our own, run first:

- every name the plan states (nodes, GPU types) follows the name rule (``autoplan.names``)
  and is a node or type of the plan's own cluster, so nothing a launch script or a message
  prints comes from anywhere but a checked cluster;
- the model is a zoo name, a Hugging Face config 'hf:' and an absolute path, or a well-formed
  ``package.module:callable`` (checked by their syntax: nothing is imported or read, a plan's
  factory is never run by a check);
- the training dtype is one autoplan knows.

``autoplan validate`` lists every problem; the other commands refuse with the first.
"""

from __future__ import annotations

import re
from typing import get_args

from autoplan import limits
from autoplan.errors import InputError, PlanInvalidError
from autoplan.names import hf_name_problem, is_hf_name, is_safe_name, shown
from autoplan.plan.schema import Plan
from autoplan.plan.validate import plan_problems
from autoplan.profile.schema import DType, Profile

__all__ = [
    "ZOO_MODEL_NAMES",
    "all_plan_problems",
    "check_plan",
    "check_runtime_engine",
    "is_factory_name",
    "model_name_problem",
    "model_name_syntax_problem",
    "simulation_size_problem",
]

# The zoo's names, for checks that must not import torch (autoplan.zoo does: its presets live
# with the model classes; show and simulate run without torch). tests/test_checks.py keeps
# this equal to autoplan.zoo.registry.model_names().
ZOO_MODEL_NAMES = frozenset(
    {
        "gpt2-small",
        "gpt2-medium",
        "gpt2-xl",
        "gpt-neo-2.7b",
        "opt-350m",
        "megatron-1.7b",
        "megatron-3.6b",
        "megatron-7.5b",
        "megatron-18.4b",
        "megatron-39.1b",
        "megatron-76.1b",
        "megatron-145.6b",
        "megatron-310.1b",
        "megatron-529.6b",
        "megatron-1t",
        "megatron-22b",
        "megatron-175b",
        "gpt3-175b",
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "qwen3-8b",
        "bert-large",
        "mixtral-8x7b",
        "qwen1.5-moe-a2.7b",
        "qwen3-30b-a3b",
        "deepseek-moe-16b",
        "gpt-tiny",
        "llama-tiny",
        "moe-tiny",
    }
)

_IDENTIFIERS = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_FACTORY = re.compile(rf"{_IDENTIFIERS}:{_IDENTIFIERS}")


def is_factory_name(name: str) -> bool:
    """True when ``name`` is a well-formed 'package.module:callable' (ASCII identifiers); an
    'hf:PATH' name never is (it names a config file, not code)."""
    return _FACTORY.fullmatch(name) is not None and not is_hf_name(name)


def model_name_syntax_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model name at all, or None: it must be a factory path, an
    'hf:' and absolute path, or a name of the zoo's form (the name rule). Torch-free, for the
    solve path."""
    if is_hf_name(name):
        return hf_name_problem(name)
    if is_factory_name(name) or is_safe_name(name):
        return None
    return (
        f"model {shown(name)} is not a zoo name or a factory 'package.module:callable' "
        "(dotted Python identifiers)"
    )


def model_name_problem(name: str) -> str | None:
    """Why ``name`` names no model autoplan can build, or None: a zoo name, or a factory path
    or Hugging Face config by syntax alone (its module is not imported, its file not read)."""
    syntax = model_name_syntax_problem(name)
    if syntax is not None or ":" in name or name in ZOO_MODEL_NAMES:
        return syntax
    return f"unknown model {shown(name)} (not in the zoo: autoplan models lists it)"


def _name_problems(plan: Plan) -> list[str]:
    cluster_nodes = {node.name: node for node in plan.inputs.cluster.nodes()}
    problems: list[str] = []

    def check(name: str, gpu_type: str, where: str) -> None:
        for value in (name, gpu_type):
            if not is_safe_name(value):
                problems.append(f"{where} names {shown(value)}, not a node or GPU type name")
                return
        node = cluster_nodes.get(name)
        if node is None:
            problems.append(f"{where} is on node {name}, which is not in the plan's cluster")
        elif node.gpu != gpu_type:
            problems.append(f"{where} says GPU type {gpu_type}; node {name} has {node.gpu}")

    for plan_node in plan.nodes:
        check(plan_node.name, plan_node.gpu_type, f"plan node {plan_node.node_rank}")
    for entry in plan.rank_map:
        check(entry.node, entry.gpu_type, f"rank {entry.rank}")
    for stage in plan.stages:
        for index, replica in enumerate(stage.replicas):
            check(replica.node, replica.gpu_type, f"stage {stage.index} replica {index}")
    gpu_types = {node.gpu for node in cluster_nodes.values()}
    named = [m.gpu_type for m in plan.prediction.memory]
    named += [idle.gpu_type for idle in plan.prediction.idle_gpus]
    for gpu_type in named:
        if gpu_type not in gpu_types:
            problems.append(
                f"the prediction names GPU type {shown(gpu_type)}, which the cluster lacks"
            )
    return problems


def _own_problems(plan: Plan) -> list[str]:
    problems = _name_problems(plan)
    model = model_name_problem(plan.inputs.model.name)
    if model is not None:
        problems.append(model)
    if plan.inputs.dtype not in get_args(DType):
        problems.append(
            f"training dtype {shown(plan.inputs.dtype)} is not one of {', '.join(get_args(DType))}"
        )
    return problems


def all_plan_problems(plan: Plan, profile: Profile | None = None, *, fit: bool = True) -> list[str]:
    """Every problem of ``plan``: autoplan's own checks (module docstring), then the
    validator's (``fit=False``: not whether its memory fits, see ``plan_problems``). Where
    our own checks already failed, a validator that trips over the same
    broken plan adds nothing rather than crashing the command."""
    own = _own_problems(plan)
    if not own:
        return plan_problems(plan, profile, fit=fit)
    try:
        return own + plan_problems(plan, profile, fit=fit)
    except Exception:  # the plan is already refused; its first problems say why
        return own


def check_plan(plan: Plan, profile: Profile | None = None, *, fit: bool = True) -> None:
    """Raise PlanInvalidError listing every problem of ``plan`` (see ``all_plan_problems``)."""
    problems = all_plan_problems(plan, profile, fit=fit)
    if problems:
        raise PlanInvalidError(problems)


def simulation_size_problem(plan: Plan) -> str | None:
    """Why ``autoplan simulate`` will not play ``plan`` (too many actions for bounded time),
    or None. Such a plan is valid; fewer micro-batches give the same per-micro-batch picture."""
    par = plan.parallelism
    actions = 2 * par.num_micro_batches * par.num_stages
    if actions <= limits.MAX_SIMULATED_ACTIONS:
        return None
    return (
        f"simulating this plan means {actions:,} forward/backward actions (2 × "
        f"{par.num_micro_batches} micro-batches × {par.num_stages} stages); simulate plays at "
        f"most {limits.MAX_SIMULATED_ACTIONS:,} (solve with fewer micro-batches to look at it)"
    )


def check_runtime_engine(plan: Plan) -> None:
    """Raise InputError (one line) unless ``plan`` is priced for autoplan's runtime, which
    ``run`` and ``launch`` start: a plan priced for another engine would be trained with its
    prediction compared against unlike figures (``autoplan.cost.engines``)."""
    if plan.inputs.engine != "autoplan":
        raise InputError(
            f"the plan is priced for {plan.inputs.engine}, not autoplan's runtime: re-price it "
            "with `autoplan cost PLAN --engine autoplan -o NEW` and run that"
        )


def check_factory_trust(
    model: str, *, trusted: bool, named: str | None, source: str, action: str
) -> None:
    """Refuse to run a factory ('package.module:callable') that came from a file, unless the
    user trusts it (``trusted``: --trust-factory) or names the same factory (``named``).

    Zoo names and Hugging Face configs ('hf:PATH') need no trust: they run autoplan's own
    code (a config is data it reads)."""
    if named is not None and not is_factory_name(named):
        raise InputError(f"--factory {shown(named)} is not of the form 'package.module:callable'")
    if ":" not in model or is_hf_name(model):
        if named is not None:
            kind = "Hugging Face config" if is_hf_name(model) else "zoo model"
            raise InputError(f"--factory {named}: {source} names the {kind} '{model}'")
        return
    if trusted or named == model:
        return
    if named is not None:
        raise InputError(f"--factory {named} is not the factory {source} names ({model})")
    raise InputError(
        f"{source} names the factory '{model}': {action} would import and run that code; "
        f"if you trust it, pass --trust-factory (or name it yourself: --factory {model})"
    )
