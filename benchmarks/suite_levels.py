"""Each configuration's level over every process a suite record holds: the mean of the processes' median step
times, whichever part of the suite ran them.

On a host-bound row one configuration's processes land far apart (at 448bff8 on an H100 the dropless Qwen3
proxy's eager variant and auto's eager run, minutes apart, took 281.5 and 515.6 ms a step), so a row of one process
a variant ranks close configurations by luck. A record holds more processes of each configuration than its rows
show: every round's variant, auto's run of what it chose, and every run of auto's probe (eager first and last, the
candidates, the confirming round's pairs). Pooled, they measure a configuration's level, and where auto's choice
stands against the fastest level says whether it chose well, apart from where its own run landed. A record resumed
on another machine pools both machines: every variant ran on each, the probe's runs only where a round probed.

A variant counts as the candidate whose overrides it sets (``cuda_graph=none`` is eager's ``none``); one that sets
none of them (recipe_default: the recipe's own graph choice) stands under its variant name.
"""

from statistics import mean
from typing import Dict, List, Optional, Tuple

from bridge.auto.candidates import options
from suite_workloads import AUTO, Workload


def configuration_names(workload: Workload) -> Dict[str, str]:
    """Each variant but auto: the candidate it sets, else its own name."""
    by_overrides = {tuple(option.overrides): option.name for option in options(workload.base)}
    return {variant: by_overrides.get(tuple(overrides), variant)
            for variant, overrides in workload.variants.items() if variant != AUTO}


def process_medians(record: dict, workload: Workload) -> Dict[str, List[float]]:
    """Every completed process's median step time (ms), by configuration, in round order: the variants', auto's
    own run (as what it chose) and its probe's runs."""
    names, found = configuration_names(workload), {}
    for each in record["round_records"]:
        for variant, row in each["rows"].items():
            name = row.get("auto_chosen") if variant == AUTO else names[variant]
            if name and row.get("status") == "completed" and row.get("median_ms"):
                found.setdefault(name, []).append(row["median_ms"])
        probe = each["rows"].get(AUTO, {}).get("auto_probe") or {}
        for run in probe.get("candidates", []):
            if run.get("status") == "completed" and run.get("median_ms"):
                found.setdefault(run["choice"], []).append(run["median_ms"])
    return found


def levels(record: dict, workload: Workload) -> List[Tuple[str, float, int]]:
    """(configuration, mean of its processes' medians in ms, how many), fastest first."""
    found = process_medians(record, workload)
    return sorted(((name, mean(medians), len(medians)) for name, medians in found.items()), key=lambda level: level[1])


def chosen_level_vs_fastest(record: dict, found: List[Tuple[str, float, int]]) -> Dict[str, Optional[float]]:
    """Each configuration auto chose in the record: its level (of ``found``, the record's levels) over the fastest
    level (1.0 when it is the fastest)."""
    by_name = {name: level for name, level, _ in found}
    fastest = min(by_name.values(), default=None)
    chosen = dict.fromkeys(each["rows"][AUTO]["auto_chosen"] for each in record["round_records"]
                           if each["rows"].get(AUTO, {}).get("auto_chosen"))
    return {name: by_name[name] / fastest if name in by_name and fastest else None for name in chosen}
