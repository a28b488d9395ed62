"""The node's scarce things: fake GPU device ids and per-pod loopback addresses.

Pure and frozen: each operation returns a new allocation, so tests read like tables and
the shell holds the single current value. A device is released only when the pod's
processes have exited (the shell's job), so a terminating pod keeps its GPU.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType


@dataclass(frozen=True)
class Devices:
    """GPU ids 0..count-1 and which pod (by uid) holds which."""

    count: int
    held: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def free(self) -> list[int]:
        taken = {device for ids in self.held.values() for device in ids}
        return [device for device in range(self.count) if device not in taken]

    def allocate(self, uid: str, wanted: int) -> tuple[Devices, tuple[int, ...] | None]:
        """Give `uid` `wanted` devices (the same ones again if it holds them already);
        None when not enough are free."""
        if uid in self.held:
            return self, self.held[uid]
        free = self.free()
        if wanted > len(free):
            return self, None
        ids = tuple(free[:wanted])
        return replace(self, held=MappingProxyType({**self.held, uid: ids})), ids

    def release(self, uid: str) -> Devices:
        if uid not in self.held:
            return self
        return replace(
            self, held=MappingProxyType({k: v for k, v in self.held.items() if k != uid})
        )


@dataclass(frozen=True)
class Addresses:
    """Loopback addresses for pods: never the network address, the host's 127.0.0.1 or a
    broadcast-looking .0/.255 host byte; handed out round-robin so a just-freed address
    is not reused while its old process might still hold a port."""

    network: str = "127.0.0.0/16"
    held: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cursor: int = 0

    def _candidate_count(self) -> int:
        blocks = ipaddress.ip_network(self.network).num_addresses // 256
        return max(blocks - 1, 0) * 254

    def _candidate(self, index: int) -> str:
        """Host bytes 1..254 of each /24 block after the network's first one (so
        127.0.0.0/24, the host's own, is never used)."""
        block, host = divmod(index, 254)
        base = ipaddress.ip_network(self.network).network_address
        return str(base + 256 * (block + 1) + host + 1)

    def allocate(self, uid: str, preferred: str = "") -> tuple[Addresses, str]:
        """An address for `uid`: the one it holds, else `preferred` when that is a free
        candidate (a pod that already ran before the agent restarted), else the next."""
        if uid in self.held:
            return self, self.held[uid]
        taken = set(self.held.values())
        if preferred and preferred not in taken and self._is_candidate(preferred):
            held = MappingProxyType({**self.held, uid: preferred})
            return replace(self, held=held), preferred
        count = self._candidate_count()
        for step in range(count):
            index = (self.cursor + step) % count
            address = self._candidate(index)
            if address not in taken:
                held = MappingProxyType({**self.held, uid: address})
                return replace(self, held=held, cursor=index + 1), address
        raise RuntimeError(f"no free pod address in {self.network}")

    def _is_candidate(self, address: str) -> bool:
        net = ipaddress.ip_network(self.network)
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        offset = int(ip) - int(net.network_address)
        return ip in net and offset >= 256 and offset % 256 not in (0, 255)

    def release(self, uid: str) -> Addresses:
        held = MappingProxyType({k: v for k, v in self.held.items() if k != uid})
        return replace(self, held=held)
