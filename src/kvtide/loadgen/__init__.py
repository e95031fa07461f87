"""A trace-driven, open-loop load generator for any OpenAI-compatible endpoint (``kvtide load``)."""

from kvtide.loadgen.client import Outcome, stream
from kvtide.loadgen.metrics import Slo, distribution, summarize
from kvtide.loadgen.prompts import Prompt, PromptBuilder
from kvtide.loadgen.runner import APIS, PROMPT_FORMATS, LoadConfig, run_load, schedule

__all__ = [
    "APIS",
    "PROMPT_FORMATS",
    "LoadConfig",
    "Outcome",
    "Prompt",
    "PromptBuilder",
    "Slo",
    "distribution",
    "run_load",
    "schedule",
    "stream",
    "summarize",
]
