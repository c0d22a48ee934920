"""IR-neutral algorithms shared by the Relax and Relay adapters."""

from .branch_grouping import CombineOptions, CombinePlan, FollowerStep, SideOperand, plan_combinations
from .combine_by_key import combine_by_key
from .emit import PlanBuilder, emit_plan
from .graph import FollowerInfo, Graph, Node, Reachability, RootInfo
from .kernel_alignment import KernelAlignment, align_kernels

__all__ = [
    "CombineOptions",
    "CombinePlan",
    "FollowerInfo",
    "FollowerStep",
    "Graph",
    "KernelAlignment",
    "Node",
    "PlanBuilder",
    "Reachability",
    "RootInfo",
    "SideOperand",
    "align_kernels",
    "combine_by_key",
    "emit_plan",
    "plan_combinations",
]
