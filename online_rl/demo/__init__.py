"""The main job's demo: simulated users on the running loop, and the report of what it learned."""

from online_rl.demo.errors import DemoError
from online_rl.demo.report import ABILITY_PROMPTS, AbilityAnswer, build_report, write_report
from online_rl.demo.run import DemoOptions, run_demo

__all__ = [
    "ABILITY_PROMPTS",
    "AbilityAnswer",
    "DemoError",
    "DemoOptions",
    "build_report",
    "run_demo",
    "write_report",
]
