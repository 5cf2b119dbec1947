"""Seeds as a command line writes them: ``--seeds 1-20,25,30-32`` (a suite's, a soak's, a CI shard's)."""

from __future__ import annotations


def parse_seeds(text: str) -> list[int]:
    """``"1-20"``, ``"1-20,25,30-32"`` -> the seeds in that order, each once; ValueError naming what is wrong."""
    seeds: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            raise ValueError(f"seeds {text!r}: an empty item (write e.g. 1-20,25,30-32)")
        lo, dash, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if dash else (int(part), int(part))
        except ValueError:
            raise ValueError(f"seeds {text!r}: {part!r} is not a seed or a range of seeds (write e.g. 1-20,25,30-32)"
                             ) from None
        if first < 0:
            raise ValueError(f"seeds {text!r}: {part!r}: a seed is 0 or more")
        if last < first:
            raise ValueError(f"seeds {text!r}: {part!r}: a range goes up (write {last}-{first})")
        seeds += [s for s in range(first, last + 1) if s not in seeds]
    return seeds


def format_seeds(seeds: list[int]) -> str:
    """``--seeds`` text for these seeds, in their order, runs of consecutive seeds as ranges: ``1-3,7``."""
    parts: list[str] = []
    i = 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ",".join(parts)
