"""Memory per llama-server process: `nvidia-smi`'s on a GPU, the resident set (/proc RSS)
on CPUs, and the card's whole used memory, whose return to its level before a start says
that an exited server's memory is free again.

The parsers of nvidia-smi's CSV (`--format=csv,noheader,nounits`) are pure; the probes run
it or read /proc.
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

APPS_QUERY = ("nvidia-smi", "--query-compute-apps=pid,used_memory",
              "--format=csv,noheader,nounits")
CARD_FIELDS = "name,driver_version,memory.total,memory.used,compute_cap"
CARD_QUERY = ("nvidia-smi", f"--query-gpu={CARD_FIELDS}", "--format=csv,noheader,nounits")


@dataclass(frozen=True)
class Card:
    name: str
    driver: str
    total_mib: int
    used_mib: int
    compute_cap: str

    @property
    def arch(self) -> str:
        """CMake's CUDA architecture for the card: compute capability 9.0 is 90."""
        return self.compute_cap.replace(".", "")


def _number(text: str) -> int | None:
    text = text.strip()
    return int(float(text)) if text.replace(".", "", 1).isdigit() else None


def parse_compute_apps(text: str) -> dict[int, int | None]:
    """`pid, used_memory` lines: MiB per process id, None where the driver says `[N/A]`
    (it cannot attribute memory to processes there); lines of prose (`No running processes
    found`) are not processes."""
    apps: dict[int, int | None] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 2 or not fields[0].isdigit():
            continue
        apps[int(fields[0])] = _number(fields[1])
    return apps


def parse_cards(text: str) -> list[Card]:
    """One card per line of the `CARD_FIELDS` query."""
    cards = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            continue
        total, used = _number(fields[2]), _number(fields[3])
        if total is None or used is None:
            raise ValueError(f"nvidia-smi gave no memory figures: {line!r}")
        cards.append(Card(fields[0], fields[1], total, used, fields[4]))
    return cards


def parse_rss_mib(status: str) -> float | None:
    """VmRSS of a /proc/PID/status, in MiB (the kernel writes kB)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


class Probe(Protocol):
    kind: str

    def process_mib(self, pid: int) -> float | None:
        """The process's memory, None when it holds none (or it is gone)."""

    def listed(self, pid: int) -> bool:
        """Whether the process still holds memory of the device (or still exists, on CPUs)."""

    def used_mib(self) -> float | None:
        """The device's whole used memory; None on CPUs."""

    def describe(self) -> dict[str, object]:
        """What the figures were read from, for the raw results."""


class NvidiaSmi:
    kind = "nvidia-smi"

    def __init__(self, index: int = 0) -> None:
        self.index = index

    def _run(self, args: tuple[str, ...]) -> str:
        return subprocess.run([*args, f"--id={self.index}"], capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def card(self) -> Card:
        (card,) = parse_cards(self._run(CARD_QUERY))
        return card

    def process_mib(self, pid: int) -> float | None:
        value = parse_compute_apps(self._run(APPS_QUERY)).get(pid)
        return None if value is None else float(value)

    def listed(self, pid: int) -> bool:
        return pid in parse_compute_apps(self._run(APPS_QUERY))

    def used_mib(self) -> float | None:
        return float(self.card().used_mib)

    def describe(self) -> dict[str, object]:
        return {"probe": self.kind, **asdict(self.card())}


class ProcRss:
    kind = "proc-rss"

    def process_mib(self, pid: int) -> float | None:
        try:
            return parse_rss_mib(Path(f"/proc/{pid}/status").read_text())
        except FileNotFoundError:
            return None

    def listed(self, pid: int) -> bool:
        return Path(f"/proc/{pid}").exists()

    def used_mib(self) -> float | None:
        return None

    def describe(self) -> dict[str, object]:
        return {"probe": self.kind}
