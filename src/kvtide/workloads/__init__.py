"""Where requests come from: trace readers and seeded synthetic generators (a leaf package).

``open_workload("builtin:chat:sessions=50")`` or ``open_workload("trace.jsonl")`` gives a
re-iterable ``Workload`` of ``kvtide.types.Request`` in arrival order; ``stats`` summarises one.
"""

from kvtide.workloads.azure import SyntheticPrefixes, add_prefixes, read_azure
from kvtide.workloads.bailian import read_bailian
from kvtide.workloads.builtins import Agent, Burst, Chat, Mixed, Rag, Tenants
from kvtide.workloads.mooncake import read_mooncake
from kvtide.workloads.registry import BUILTINS, DEFAULT_BUILTIN, detect_format, open_workload
from kvtide.workloads.stats import stats
from kvtide.workloads.tokens import read_tokens
from kvtide.workloads.workload import Workload

__all__ = [
    "BUILTINS",
    "DEFAULT_BUILTIN",
    "Agent",
    "Burst",
    "Chat",
    "Mixed",
    "Rag",
    "SyntheticPrefixes",
    "Tenants",
    "Workload",
    "add_prefixes",
    "detect_format",
    "open_workload",
    "read_azure",
    "read_bailian",
    "read_mooncake",
    "read_tokens",
    "stats",
]
