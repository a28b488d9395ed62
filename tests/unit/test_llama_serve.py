"""e2e/llama/serve.py: modelpool/llama-server's arguments made local for the node agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.llama import models, serve

pytestmark = pytest.mark.unit


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def write_model(directory: Path, name: str, size: str = "tiny") -> Path:
        calls.append((name, size))
        return directory / (f"{name}.gguf" if size == "tiny" else f"{name}-{size}.gguf")

    monkeypatch.setattr(models, "write_model", write_model)
    return calls


def test_the_images_models_and_the_pods_address_replace_the_containers(
    written: list[tuple[str, str]],
) -> None:
    args = ["--model", "/models/gemma.gguf", "--host", "0.0.0.0", "--port", "8080",
            "--alias", "gemma"]
    assert serve.server_args(args, Path("/c"), "127.0.3.4") == [
        "--model", "/c/gemma.gguf", "--host", "127.0.3.4", "--port", "8080", "--alias", "gemma"]
    assert written == [("gemma", "tiny")]


def test_a_large_model_is_generated_large(
    written: list[tuple[str, str]],
) -> None:
    assert serve.server_args(["-m", "/models/alpha-large.gguf"], Path("/c"), None) == [
        "-m", "/c/alpha-large.gguf"]
    assert written == [("alpha", "large")]


def test_without_a_host_flag_the_pods_address_is_added(written: list[tuple[str, str]]) -> None:
    assert serve.server_args(["--port", "1"], Path("/c"), "127.0.0.9") == [
        "--port", "1", "--host", "127.0.0.9"]


def test_weights_this_machine_lacks_get_a_stand_in_of_their_name(
    written: list[tuple[str, str]], tmp_path: Path,
) -> None:
    present = tmp_path / "here.gguf"
    present.write_bytes(b"GGUF")
    assert serve.server_args(["--model", str(present)], Path("/c"), None) == [
        "--model", str(present)]
    assert serve.server_args(["--model", "/srv/w/gemma-3-4b-it-Q4_K_M.gguf"], Path("/c"),
                             None) == ["--model", "/c/gemma-3-4b-it-Q4_K_M.gguf"]
    assert written == [("gemma-3-4b-it-Q4_K_M", "tiny")]
