"""The router's ConfigMap followed through a watch (sidecar.reload.follow): what applies a
new config, and what keeps the one in force."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.kube_port import Changed, Deleted, Listed, WatchEvent
from sidecar.reload import ConfigData, WatchedFile, follow

pytestmark = pytest.mark.unit

KEY = "config.json"


def parse(content: bytes) -> str:
    text = content.decode()
    if not text.startswith("v"):
        raise ValueError(f"not a config: {text!r}")
    return text


async def run(events: list[WatchEvent[ConfigData]]) -> list[str]:
    applied: list[str] = []
    watched = WatchedFile(Path("/unused"), parse, applied.append, label="ConfigMap ns/chat-config")
    watched.prime(b"v1")  # what the file held at start

    async def stream() -> AsyncIterator[WatchEvent[ConfigData]]:
        for event in events:
            yield event

    await follow(stream(), KEY, watched)
    return applied


def cm(content: str | None, name: str = "chat-config") -> ConfigData:
    return ConfigData(name, {} if content is None else {KEY: content})


async def test_a_new_config_applies_once_and_the_one_at_start_is_not_applied_again() -> None:
    assert await run([Listed((cm("v1"),)), Changed(cm("v2")), Changed(cm("v2")),
                      Changed(cm("v3"))]) == ["v2", "v3"]


async def test_a_relist_after_the_watch_expired_applies_only_what_changed() -> None:
    assert await run([Listed((cm("v2"),)), Listed((cm("v2"),)), Listed((cm("v3"),))]) == [
        "v2", "v3"]


async def test_what_cannot_be_a_config_keeps_the_one_in_force(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "sidecar.reload")
    events: list[WatchEvent[ConfigData]] = [
        Listed(()),  # not there (yet)
        Changed(cm(None)),  # without the key
        Changed(cm("broken")),  # does not parse
        Deleted("chat-config"),
        Changed(cm("v2")),  # written again
    ]
    assert await run(events) == ["v2"]
    messages = "\n".join(r.getMessage() for r in caplog.records)
    assert "ConfigMap ns/chat-config not found: keeping the current config" in messages
    assert "ConfigMap chat-config has no key config.json" in messages
    assert "keeping the previous ConfigMap ns/chat-config: the new one is invalid" in messages
    assert "ConfigMap chat-config deleted: keeping the current config" in messages
    assert "reloaded ConfigMap ns/chat-config" in messages
