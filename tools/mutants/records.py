"""The verdicts kept between runs (tools/records/*.jsonl): a kill stays valid while the mutant,
the tiers' files and the package's tests are unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from tools.mutants import ROOT
from tools.mutants.tiers import CHECK_TIERS, tier_files

# Verdicts a record keeps: a time-out or an error is run again.
VERDICTS = ("killed", "equivalent", "SURVIVED")


def fingerprint(mutant, tiers: list[tuple[str, list[str]]]) -> str:
    """What a verdict depends on: the mutated file, the tiers run, and the files they run
    (`tier_files`); an edit elsewhere keeps the record."""

    digest = hashlib.sha256(f"{json.dumps(tiers)} {mutant.id}\n".encode())
    digest.update(mutant.mutated_source().encode())
    for file, other in mutant.other_sources().items():
        digest.update(f"{file}\n{other}".encode())
    for path in tier_files(tiers):
        digest.update(f"{path.relative_to(ROOT)}\n".encode() + path.read_bytes())
    return digest.hexdigest()


def source_digest(mutant) -> str:
    """The mutant itself: its id and mutated file, whatever tests judge it."""

    others = "".join(f"{file}\n{other}" for file, other in mutant.other_sources().items())
    return hashlib.sha256(f"{mutant.id}\n{mutant.mutated_source()}{others}".encode()).hexdigest()


def recorded_kills(path: Path, mutants: list) -> dict[str, tuple[str, str, float]]:
    """{id: ('killed', detail, seconds)} of the mutants `path` records a kill of, by mutated source,
    whatever the tests are now: a kill is a fact about the mutant (a test the unmutated kernel
    passes failed on it, or its kernel hung), which a stronger test cannot undo; a survival or an
    equivalence is judged again when the tests change (load_record)."""
    if not path.exists():
        return {}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kills = {entry["source"]: entry for entry in entries if entry["status"] == "killed" and "source" in entry}
    found = {mutant.id: kills.get(source_digest(mutant)) for mutant in mutants}
    return {key: (entry["status"], entry["detail"], entry["seconds"]) for key, entry in found.items() if entry}


def load_record(path: Path, mutants: list, tiers: dict[str, list]) -> dict[str, tuple[str, str, float]]:
    """{id: (status, detail, seconds)} of the mutants `path` judged with the same fingerprint; a
    kill (or the bitwise tier's equivalence) also where it was judged by the first of these tiers
    only (a `--smoke-only` run): a whole run would have stopped at that tier too. (A kill holds
    whatever the tests are now: recorded_kills.)"""
    if not path.exists():
        return {}
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_fingerprint = {entry["fingerprint"]: entry for entry in entries if entry["status"] in VERDICTS}
    found = {}
    for mutant in mutants:
        mutant_tiers = tiers[mutant.id]
        entry = by_fingerprint.get(fingerprint(mutant, mutant_tiers))
        for first in range(len(mutant_tiers) - 1, 0, -1):
            if entry is not None:
                break
            earlier = by_fingerprint.get(fingerprint(mutant, mutant_tiers[:first]))
            entry = earlier if earlier is not None and earlier["status"] in ("killed", "equivalent") else None
        if entry is not None:
            found[mutant.id] = (entry["status"], entry["detail"], entry["seconds"])
    return found


def append_record(path: Path, mutant, tiers: list, outcome: tuple[str, str, float]) -> None:
    status, detail, seconds = outcome
    checks = len(list(itertools.takewhile(lambda tier: tier[0] in CHECK_TIERS, tiers)))
    if status == "equivalent" and checks:
        # Settled by its reason's GPU check alone: a change of the tests after it keeps the verdict.
        tiers = tiers[:checks]
    entry = dict(id=mutant.id, fingerprint=fingerprint(mutant, tiers), source=source_digest(mutant), status=status)
    with path.open("a") as record:
        record.write(json.dumps({**entry, "detail": detail, "seconds": round(seconds, 1)}) + "\n")


def cpu_tier_passed(status: str, detail: str, seconds: float) -> tuple[str, str, float]:
    """--cpu-only: a mutant that passes the CPU tier has not survived, its GPU tiers are to judge it."""
    if status == "SURVIVED":
        return "NOT RUN", "passed the CPU tier (--cpu-only): its GPU tiers judge it", seconds
    return status, detail, seconds
