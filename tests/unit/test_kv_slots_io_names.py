"""reconciler/kv_slots_io.py's pure half: the identity folded into slot file names, the
identity of a process as the reconciler sees it, and `status.kvCache` built and read
back."""

from __future__ import annotations

import dataclasses

import pytest

from e2e.fake_model.kv_slots import valid_filename
from reconciler.kv_cache import Identity, Saved
from reconciler.kv_slots_io import (
    IdentityArgs,
    SaveReport,
    identity_hash,
    identity_of,
    manifest_from,
    slot_file,
    status_value,
)

pytestmark = pytest.mark.unit

UID = "5f0c2a1e-0000-4000-8000-000000000001"
IDENTITY = identity_of(IdentityArgs("/models/gemma.gguf", ("-c", "8192", "-ctk", "q8_0")),
                       1024)


def test_the_identity_is_the_model_argument_the_context_and_the_cache_arguments() -> None:
    assert Identity("/models/gemma.gguf", 0, 0, 1024, ("--cache-type-k", "q8_0")) == IDENTITY


def test_a_file_name_holds_the_member_its_uid_the_identity_and_the_slot() -> None:
    name = slot_file("gemma-slot", UID, IDENTITY, 3)
    assert name == f"gemma-slot-5f0c2a1e-{identity_hash(IDENTITY)}-slot3.bin"
    assert valid_filename(name)


@pytest.mark.parametrize("other", [
    dataclasses.replace(IDENTITY, n_ctx=2048),
    dataclasses.replace(IDENTITY, model="/models/coder.gguf"),
    dataclasses.replace(IDENTITY, args=("--cache-type-k", "f16")),
])
def test_another_identity_never_shares_a_file_name(other: Identity) -> None:
    assert slot_file("gemma", UID, other, 0) != slot_file("gemma", UID, IDENTITY, 0)


def test_the_status_value_is_the_manifest_and_reads_back() -> None:
    saved = (Saved(1, "f1", 40, 900), Saved(0, "f0", 30, 700))
    value = status_value(SaveReport(IDENTITY, saved), now=1000.0)
    assert value is not None
    manifest = manifest_from(value)
    assert (manifest.identity, manifest.saved_at, manifest.slots) == (IDENTITY, 1000.0, saved)
    assert status_value(SaveReport(IDENTITY), now=1000.0) is None
    assert status_value(SaveReport(None, error="refused"), now=1000.0) is None


@pytest.mark.parametrize(("value", "why"), [
    ("a string", "not an object"),
    ({"version": 2}, "not version 1"),
    ({"version": 1, "savedAt": 1.0, "slots": []}, "lacks or mistypes"),
])
def test_a_status_value_that_cannot_be_trusted_is_refused(value: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        manifest_from(value)
