"""Which API a path speaks (sidecar.apis), the `model` field of a multipart form
(sidecar.multipart, judged by httpx's encoder, the one the `openai` SDK sends audio with),
the router's answers in each dialect (sidecar.dialects), and keys as each client sends them."""

from __future__ import annotations

import json

import httpx
import pytest

from sidecar import apis, dialects, errors, multipart
from sidecar.auth import parse_keys

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("path", "label", "dialect"),
    [
        ("/v1/chat/completions", "chat", "openai"),
        ("/v1/completions", "completions", "openai"),
        ("/infill", "completions", "openai"),
        ("/v1/embeddings", "embeddings", "openai"),
        ("/v1/responses", "responses", "openai"),
        ("/v1/responses/input_tokens", "responses", "openai"),
        ("/v1/messages", "messages", "anthropic"),
        ("/v1/messages/count_tokens", "messages", "anthropic"),
        ("/v1/rerank", "rerank", "openai"),
        ("/v1/score", "rerank", "openai"),
        ("/v1/audio/transcriptions", "audio", "openai"),
        ("/tokenize", "tokenize", "openai"),
        ("/apply-template", "tokenize", "openai"),
        ("/classify", "other", "openai"),
    ],
)
def test_each_routed_path_belongs_to_one_api(path: str, label: str, dialect: str) -> None:
    api = apis.api_of(path)
    assert api is not None
    assert (api.label, api.dialect) == (label, dialect)
    assert api.label in apis.LABELS


def test_only_audio_uploads_are_forms_and_unknown_paths_are_not_routed() -> None:
    assert [p for p, a in apis.ROUTED.items() if a.form] == [
        "/v1/audio/transcriptions", "/audio/transcriptions", "/v1/audio/translations"]
    assert apis.api_of("/v1/files") is None
    assert apis.api_of("/v1/messages/") is None
    assert apis.api_of("/props") is None


@pytest.mark.parametrize(
    ("path", "target", "backend", "rest"),
    [
        ("/upstream/gemma/props", "/upstream/gemma/props", "gemma", "/props"),
        ("/upstream/gemma/slots/0", "/upstream/gemma/slots/0?action=save",
         "gemma", "/slots/0?action=save"),
        ("/upstream/gemma", "/upstream/gemma?x=1", "gemma", "/?x=1"),
        ("/upstream/qwen%2F7b/health", "/upstream/qwen%2F7b/health", "qwen/7b", "/health"),
        ("/upstream//props", "/upstream//props", "", "/props"),
        ("/upstream/gemma/../x", "/upstream/gemma/../x", "", "/"),
    ],
)
def test_the_upstream_door_names_a_backend_and_a_path(
    path: str, target: str, backend: str, rest: str
) -> None:
    assert apis.upstream_door(path, target) == apis.UpstreamDoor(backend, rest)


def test_a_path_outside_the_door_is_not_a_door() -> None:
    assert apis.upstream_door("/v1/models", "/v1/models") is None
    assert apis.upstream_door("/upstreamx/a/b", "/upstreamx/a/b") is None


def _form(data: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://router/v1/audio/transcriptions", data=data,
                            files=files)
    return request.read(), request.headers["content-type"]


def test_the_model_field_is_read_from_the_form_an_sdk_sends() -> None:
    audio = b"RIFF" + bytes(range(256)) * 4000 + b'\r\n--name="model"\r\n'
    body, content_type = _form({"model": "whisper-small", "language": "en"},
                               {"file": ("clip.wav", audio)})
    assert multipart.form_field(body, content_type, "model") == "whisper-small"
    assert multipart.form_field(body, content_type, "language") == "en"
    assert multipart.form_field(body, content_type, "prompt") is None


def test_a_file_part_named_model_is_not_the_model() -> None:
    body, content_type = _form({}, {"model": ("model.bin", b"weights")})
    assert multipart.form_field(body, content_type, "model") is None
    body, content_type = _form({"model": "m1"}, {"file": ("a.wav", b"x")})
    assert multipart.form_field(body, content_type, "model") == "m1"


@pytest.mark.parametrize(
    ("content_type", "body", "says"),
    [
        (None, b"", "no Content-Type"),
        ("application/json", b"{}", "not multipart/form-data"),
        ("multipart/form-data", b"", "no valid boundary"),
        ("multipart/form-data; boundary=abc", b"no delimiter here", "does not contain"),
        ("multipart/form-data; boundary=abc", b"--abc\r\nContent-Disposition: form-data;"
         b' name="model"\r\n\r\nm1', "no closing boundary"),
        ("multipart/form-data; boundary=abc", b"--abc\r\nContent-Disposition: form-data;",
         "no end to its headers"),
        ("multipart/form-data; boundary=abc", b"--abc\r\nContent-Disposition: form-data;"
         b' name="model"\r\n\r\n\xff\xfe\r\n--abc--\r\n', "not UTF-8"),
    ],
)
def test_a_body_that_is_not_the_form_it_claims_is_refused_saying_why(
    content_type: str | None, body: bytes, says: str
) -> None:
    with pytest.raises(multipart.FormError, match=says):
        multipart.form_field(body, content_type, "model")


def test_a_quoted_boundary_is_read() -> None:
    body = (b'--a b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm2\r\n--a b--\r\n')
    assert multipart.form_field(body, 'multipart/form-data; boundary="a b"', "model") == "m2"


@pytest.mark.parametrize(
    ("err", "anthropic_type"),
    [
        (errors.bad_request("no model", param="model"), "invalid_request_error"),
        (errors.unauthorized(), "authentication_error"),
        (errors.model_not_found("x"), "not_found_error"),
        (errors.method_not_allowed("GET", "/v1/messages"), "invalid_request_error"),
        (errors.body_too_large(10), "request_too_large"),
        (errors.internal(), "api_error"),
        (errors.ProxyError(503, "swapping", type="service_unavailable", code="held",
                           retry_after=2.2), "overloaded_error"),
        (errors.ProxyError(504, "slow", type="upstream_error", code="upstream_timeout"),
         "api_error"),
    ],
)
def test_an_error_on_a_messages_path_takes_the_anthropic_shape(
    err: errors.ProxyError, anthropic_type: str
) -> None:
    status, headers, body = dialects.answer(err, apis.MESSAGES)
    assert status == err.status
    assert json.loads(body) == {"type": "error",
                                "error": {"type": anthropic_type, "message": err.message}}
    assert ("Retry-After", "3") in headers if err.retry_after else True


def test_an_error_elsewhere_keeps_the_openai_shape() -> None:
    err = errors.model_not_found("ghost")
    for api in (apis.CHAT, apis.RESPONSES, apis.RERANK, apis.AUDIO):
        assert dialects.answer(err, api) == errors.answer(err)


def test_an_error_after_a_held_streams_headers_is_the_dialects_event() -> None:
    err = errors.ProxyError(503, "the swap was abandoned", type="service_unavailable",
                            code="swap_abandoned")
    assert dialects.stream_error(err, apis.CHAT) == (
        b"data: " + json.dumps(errors.error_body(err)).encode() + b"\n\n")
    event, data = dialects.stream_error(err, apis.MESSAGES).decode().split("\n")[:2]
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error", "error": {"type": "overloaded_error", "message": err.message}}
    event, data = dialects.stream_error(err, apis.RESPONSES).decode().split("\n")[:2]
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error", "code": "swap_abandoned", "message": err.message, "param": None,
        "sequence_number": 0}


@pytest.mark.parametrize(
    ("authorization", "api_key", "allowed"),
    [
        (None, "k1", True),
        (None, " k2 ", True),
        (None, "k3", False),
        ("Bearer k3", "k1", True),
        ("Bearer k1", "k3", True),
        ("Basic k1", None, False),
        (None, None, False),
        (None, "", False),
    ],
)
def test_a_key_comes_as_a_bearer_token_or_as_x_api_key(
    authorization: str | None, api_key: str | None, allowed: bool
) -> None:
    assert parse_keys("k1\nk2\n").allows(authorization, api_key) is allowed
