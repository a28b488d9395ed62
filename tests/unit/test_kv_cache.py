"""reconciler/kv_cache.py: which slots a save takes and in what order, the caps, the
arguments that change a KV cache, and when a manifest may be restored."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler import kv_cache, kv_clean
from reconciler.kv_cache import Caps, Identity, Manifest, Saved, Slot

pytestmark = pytest.mark.unit

IDENTITY = Identity("/models/gemma.gguf", 1000, 17, 1024, ("--cache-type-k", "q8_0"))


@pytest.mark.parametrize(("argv", "expected"), [
    (["--model", "/m.gguf", "-c", "2048", "-np", "2"], ()),
    (["-ctk", "q8_0", "--cache-type-v", "q4_0"], ("--cache-type-k", "q8_0", "--cache-type-v",
                                                   "q4_0")),
    (["--cache-type-k=f16", "-fa", "on"], ("--cache-type-k", "f16", "--flash-attn", "on")),
    (["-kvu", "--swa-full", "--alias", "x"], ("--kv-unified", "--swa-full")),
    (["--rope-freq-base", "10000", "--lora", "a.gguf", "--host", "0.0.0.0"],
     ("--rope-freq-base", "10000", "--lora", "a.gguf")),
    (["--control-vector-layer-range", "1", "4", "--port", "8080"],
     ("--control-vector-layer-range", "1", "4")),
])
def test_cache_args_keep_what_changes_the_cache_under_one_name(
        argv: list[str], expected: tuple[str, ...]) -> None:
    assert kv_cache.cache_args(argv) == expected


def test_slots_from_llama_servers_answer() -> None:
    listed = [{"id": 0, "n_ctx": 1024, "is_processing": False},
              {"id": 1, "n_ctx": 1024, "is_processing": True, "id_task": 7,
               "n_prompt_tokens": 52}]
    assert kv_cache.slots_from(listed) == [Slot(0, 1024, False, None), Slot(1, 1024, True, 7)]
    with pytest.raises(ValueError, match="not a slot"):
        kv_cache.slots_from([{"n_ctx": 3}])
    with pytest.raises(ValueError, match="list"):
        kv_cache.slots_from({"id": 0})


def test_the_save_order_is_most_recently_used_first_and_skips_empty_slots() -> None:
    slots = [Slot(0, 1024, False, 3), Slot(1, 1024, False, None), Slot(2, 1024, False, 9),
             Slot(3, 1024, False, 5)]
    assert kv_cache.save_order(slots) == [2, 3, 0]


@pytest.mark.parametrize(("elapsed", "written", "largest", "may"), [
    (0.0, 0, 0, True),
    (4.9, 0, 0, True),
    (5.0, 0, 0, False),            # the time cap
    (1.0, 900, 100, True),         # exactly at the size cap
    (1.0, 901, 100, False),        # another file like the largest would pass it
])
def test_another_save_starts_only_within_both_caps(
        elapsed: float, written: int, largest: int, may: bool) -> None:
    assert kv_cache.may_save_another(Caps(5.0, 1000), elapsed, written, largest) is may


def test_file_names_are_the_members_own() -> None:
    a = kv_cache.file_name("gemma", "1b2c3d4e-aaaa-bbbb", 0)
    assert a == "gemma-1b2c3d4e-slot0.bin"
    assert a != kv_cache.file_name("gemma", "99999999-aaaa-bbbb", 0)  # a re-created member
    assert ":" not in a and "/" not in a


def test_a_manifest_round_trips_and_a_bad_one_names_what_is_wrong() -> None:
    manifest = Manifest(IDENTITY, 100.0, (Saved(1, "gemma-1-slot1.bin", 52, 27560),))
    assert Manifest.from_json(manifest.to_json()) == manifest
    with pytest.raises(ValueError, match="not JSON"):
        Manifest.from_json("{")
    with pytest.raises(ValueError, match="version 1"):
        Manifest.from_json('{"version": 2}')
    with pytest.raises(ValueError, match="lacks or mistypes"):
        Manifest.from_json('{"version": 1, "identity": {}, "slots": [], "savedAt": 1}')


@pytest.mark.parametrize(("identity", "now", "why"), [
    (IDENTITY, 150.0, None),
    (Identity("/models/other.gguf", 1000, 17, 1024, IDENTITY.args), 150.0,
     "made for another model"),
    (Identity(IDENTITY.model, 1000, 17, 2048, IDENTITY.args), 150.0, "made for another n_ctx"),
    (Identity(IDENTITY.model, 1000, 18, 1024, IDENTITY.args), 150.0,
     "made for another model_mtime"),
    (Identity(IDENTITY.model, 1000, 17, 1024, ()), 150.0, "made for another args"),
    (IDENTITY, 100.0 + 3601, "older than 3600s"),
])
def test_a_manifest_is_restored_only_into_the_same_cache(
        identity: Identity, now: float, why: str | None) -> None:
    manifest = Manifest(IDENTITY, 100.0, ())
    assert kv_cache.restorable(manifest, identity, now, 3600) == why


def test_the_restore_plan_puts_each_slot_back_where_it_fits() -> None:
    manifest = Manifest(IDENTITY, 1.0, (Saved(0, "a", 52, 1), Saved(1, "b", 2000, 1),
                                        Saved(5, "c", 10, 1), Saved(2, "d", 0, 1)))
    slots = {i: Slot(i, 1024, False, None) for i in range(3)}
    assert [s.file for s in kv_cache.restore_plan(manifest, slots)] == ["a"]


# Removing stale files before a member starts

UID = "0123abcd-0000-4000-8000-000000000000"


def _file(name: str, size: int = 10, mtime: float = 1000.0) -> kv_cache.OnDisk:
    return kv_cache.OnDisk(name, size, mtime)


@pytest.mark.parametrize(("files", "max_bytes", "gone"), [
    # its own, fresh and within the cap: kept
    ([_file("chat-0123abcd-deadbeef-slot0.bin")], None, []),
    # an earlier member of the same name (another UID)
    ([_file("chat-99999999-deadbeef-slot0.bin")], None, ["chat-99999999-deadbeef-slot0.bin"]),
    # older than max_age (100 s)
    ([_file("chat-0123abcd-deadbeef-slot0.bin", mtime=899.0)], None,
     ["chat-0123abcd-deadbeef-slot0.bin"]),
    # another member's, even one whose name starts with this one's, and other files
    ([_file("chat-2-99999999-deadbeef-slot0.bin"), _file("other-99999999-deadbeef-slot0.bin"),
      _file("chat-notes.txt", mtime=0.0)], None, []),
    # past the size cap: the oldest go first
    ([_file("chat-0123abcd-aaaaaaaa-slot0.bin", 60, 990.0),
      _file("chat-0123abcd-bbbbbbbb-slot0.bin", 60, 995.0),
      _file("chat-0123abcd-bbbbbbbb-slot1.bin", 30, 996.0)], 100,
     ["chat-0123abcd-aaaaaaaa-slot0.bin"]),
])
def test_stale_files_are_the_members_own_that_no_restore_trusts(
        files: list[kv_cache.OnDisk], max_bytes: int | None, gone: list[str]) -> None:
    assert kv_cache.stale_files(files, "chat", UID, 1000.0, 100.0, max_bytes) == gone


def test_kv_clean_removes_the_stale_files_and_never_fails(tmp_path: Path) -> None:
    (tmp_path / "chat-99999999-deadbeef-slot0.bin").write_bytes(b"x")
    (tmp_path / "chat-0123abcd-deadbeef-slot0.bin").write_bytes(b"x")
    (tmp_path / "other-99999999-deadbeef-slot0.bin").write_bytes(b"x")
    assert kv_clean.main(["--dir", str(tmp_path), "--member", "chat", "--uid", UID,
                          "--max-age", "3600"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "chat-0123abcd-deadbeef-slot0.bin", "other-99999999-deadbeef-slot0.bin"]
    assert kv_clean.main(["--dir", str(tmp_path / "absent"), "--member", "chat",
                          "--uid", UID, "--max-age", "1"]) == 0


def test_a_slot_files_owner_is_its_member_and_the_first_part_of_its_uid() -> None:
    assert kv_cache.owner("chat", UID) == f"chat-{UID.split('-')[0]}"


def test_unkept_files_are_the_slot_files_of_owners_not_kept() -> None:
    names = ["chat-a1b2c3d4-00000000-slot0.bin", "chat-a1b2c3d4-11111111-slot1.bin",
             "qwen-2-7b-0a1b2c3d-22222222-slot0.bin", "old-9e8d7c6b-33333333-slot2.bin",
             "chat-a1b2c3d4-slot0.bin", "readme.txt"]
    assert kv_cache.unkept_files(names, {"chat-a1b2c3d4", "qwen-2-7b-0a1b2c3d"}) == [
        "old-9e8d7c6b-33333333-slot2.bin"]
    assert kv_cache.unkept_files(names, {"qwen-2-7b-0a1b2c3d"}) == [
        "chat-a1b2c3d4-00000000-slot0.bin", "chat-a1b2c3d4-11111111-slot1.bin",
        "old-9e8d7c6b-33333333-slot2.bin"]
    assert kv_cache.unkept_files(names, set()) == sorted(names[:4])
    # an owner is the whole prefix: a member whose name ends like another's keeps its own
    assert kv_cache.unkept_files(["b-chat-a1b2c3d4-00000000-slot0.bin"],
                                 {"chat-a1b2c3d4"}) == ["b-chat-a1b2c3d4-00000000-slot0.bin"]
