"""Every API through the router (sidecar.apis, sidecar.dialects), judged by the official
`openai` and `anthropic` SDKs: Responses and Messages answered by the fake model server
(held to a real llama-server by the contract suites), held streams in each dialect, keys
as each client sends them, an audio form routed by its `model` field, the door
`/upstream/{backend}/...`, and bad input answered in the caller's dialect with nothing
sent to a member. The activator is the url-only stand-in: `held` is held until
`release()`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx
import openai
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from e2e.fake_model.harness import run_fake_model
from sidecar.app import Live, make_app
from sidecar.auth import parse_keys
from sidecar.config import parse_config
from sidecar.metrics import RouterMetrics
from tests.functional.proxy_support import (
    StandInActivation,
    config_json,
    serve_app,
    until,
    url_backend,
)

pytestmark = pytest.mark.functional

KEY = "sk-router"
ASK: Any = [{"role": "user", "content": "the pool"}]


@dataclass
class Echo:
    """A member that answers every path and method with what it received."""

    received: list[dict[str, Any]]

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        seen = {"method": request.method, "path": request.path_qs,
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body": body.decode("utf-8", "replace")}
        self.received.append(seen)
        return web.json_response(seen)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@dataclass
class Router:
    root: str
    activation: StandInActivation
    registry: CollectorRegistry
    echo: Echo
    http: aiohttp.ClientSession

    def openai(self, key: str = KEY) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.root + "/v1", api_key=key, max_retries=0,
                                  timeout=30)

    def anthropic(self, key: str = KEY) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.root, api_key=key, max_retries=0,
                                        timeout=30)

    def requests(self, **labels: str) -> float:
        wanted = {"router": "chat", **labels}
        return sum(s.value for family in self.registry.collect() for s in family.samples
                   if s.name == "modelpool_requests_total"
                   and wanted.items() <= s.labels.items())

    async def post(self, path: str, body: bytes, **headers: str) -> tuple[int, Any]:
        async with self.http.post(self.root + path, data=body,
                                  headers={"Authorization": f"Bearer {KEY}", **headers}) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture
async def router(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Router]:
    overrides: dict[str, Any] = dict(getattr(request, "param", {}))
    echo = Echo([])
    async with (
        run_fake_model("--mode", "llamacpp", "--alias", "alpha", "--tokens-per-second",
                       "2000", log_path=tmp_path / "alpha.log") as alpha,
        serve_app(echo.app()) as echo_url,
    ):
        config = parse_config(config_json(
            [url_backend("alpha", alpha.base_url, "a1"),
             url_backend("held", alpha.base_url, pool="heavy"),
             url_backend("echo", echo_url)],
            **{"maxBodyBytes": 64 * 1024, **overrides}))
        registry = CollectorRegistry()
        metrics = RouterMetrics(registry, "chat")
        activation = StandInActivation(config, metrics)
        app = make_app(Live(config, parse_keys(KEY)), activation, metrics, connect_timeout=2.0)
        async with serve_app(app) as url, aiohttp.ClientSession() as http:
            yield Router(url, activation, registry, echo, http)


async def test_responses_plain_and_streamed_reach_the_member_the_model_names(
    router: Router,
) -> None:
    async with router.openai() as client:
        answer = await client.responses.create(model="a1", input="the pool",
                                               max_output_tokens=3)
        assert answer.output_text == "the pool shares"
        stream = await client.responses.create(model="alpha", input="the pool",
                                               max_output_tokens=2, stream=True)
        kinds = [event.type async for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert router.requests(model="alpha", code="200", api="responses") == 2


async def test_messages_authenticate_with_x_api_key_and_count_tokens(router: Router) -> None:
    async with router.anthropic() as client:
        message = await client.messages.create(model="alpha", max_tokens=3, messages=ASK)
        counted = await client.messages.count_tokens(model="alpha", messages=ASK)
    assert message.content[0].type == "text" and message.content[0].text == "the pool shares"
    assert counted.input_tokens == 2
    assert router.requests(model="alpha", code="200", api="messages") == 2


async def test_a_wrong_key_and_an_unknown_model_are_anthropic_errors_on_messages(
    router: Router,
) -> None:
    async with router.anthropic("wrong") as client:
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await client.messages.create(model="alpha", max_tokens=3, messages=ASK)
    assert refused.value.body == {"type": "error", "error": {
        "type": "authentication_error",
        "message": "Missing or invalid API key: send 'Authorization: Bearer <key>' or"
                   " 'x-api-key: <key>'."}}
    async with router.anthropic() as client:
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.messages.create(model="ghost", max_tokens=3, messages=ASK)
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert "ghost" in missing.value.body["error"]["message"]
    async with router.openai("wrong") as oa:
        with pytest.raises(openai.AuthenticationError):
            await oa.responses.create(model="alpha", input="x", max_output_tokens=1)


async def test_a_held_messages_stream_waits_with_comments_then_streams(router: Router) -> None:
    async with router.anthropic() as client, client.messages.stream(
            model="held", max_tokens=3, messages=ASK) as stream:
        # Its 200 and the keep-alive comments go out while it is held.
        await until(lambda: router.activation.progress_asked >= 1)
        router.activation.release()
        final = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "the pool shares"


async def test_a_held_messages_stream_refused_after_its_200_ends_with_an_error_event(
    router: Router,
) -> None:
    async with router.anthropic() as client:
        with pytest.raises(anthropic.APIStatusError) as ended:
            async with client.messages.stream(model="held", max_tokens=3,
                                              messages=ASK) as stream:
                await until(lambda: router.activation.progress_asked >= 1)
                await router.activation.shutdown(retry_after=3.0)
                await stream.get_final_message()
    assert "shutting down" in str(ended.value)


async def test_a_held_responses_stream_refused_after_its_200_ends_with_an_error_event(
    router: Router,
) -> None:
    async with router.openai() as client:
        stream = await client.responses.create(model="held", input="x", max_output_tokens=2,
                                               stream=True)
        await until(lambda: router.activation.progress_asked >= 1)
        await router.activation.shutdown(retry_after=3.0)
        events = [event async for event in stream]
    assert [e.type for e in events] == ["error"]
    error = events[0]
    assert isinstance(error, openai.types.responses.ResponseErrorEvent)
    assert "shutting down" in error.message


async def test_an_audio_form_goes_to_the_member_its_model_field_names(router: Router) -> None:
    async with router.openai() as client:
        heard = await client.audio.transcriptions.create(
            model="alpha", file=("clip.wav", b"RIFF" + bytes(1000)))
    assert heard.text == "alpha heard 1004 bytes of audio"
    assert router.requests(model="alpha", code="200", api="audio") == 1


async def test_every_routed_api_passes_its_query_and_headers_and_not_the_routers_key(
    router: Router,
) -> None:
    for path in ("/v1/messages?beta=true", "/v1/rerank", "/tokenize", "/v1/score",
                 "/v1/chat/completions/input_tokens", "/infill", "/apply-template"):
        status, _ = await router.post(path, b'{"model": "echo"}', **{
            "x-api-key": KEY, "anthropic-version": "2023-06-01",
            "anthropic-beta": "tools-2024-04-04"})
        assert status == 200, path
    assert [r["path"] for r in router.echo.received] == [
        "/v1/messages?beta=true", "/v1/rerank", "/tokenize", "/v1/score",
        "/v1/chat/completions/input_tokens", "/infill", "/apply-template"]
    for seen in router.echo.received:
        headers = seen["headers"]
        assert "authorization" not in headers and "x-api-key" not in headers
        assert headers["anthropic-version"] == "2023-06-01"
        assert headers["anthropic-beta"] == "tools-2024-04-04"
    assert router.requests(model="echo", api="rerank") == 2
    assert router.requests(model="echo", api="tokenize") == 2


async def test_the_upstream_door_reaches_any_path_of_one_backend_behind_the_key(
    router: Router,
) -> None:
    async with router.http.get(router.root + "/upstream/alpha/props") as r:
        assert r.status == 401
    async with router.http.get(router.root + "/upstream/alpha/props",
                               headers={"x-api-key": KEY}) as r:
        assert r.status == 200
        props = await r.json()
    assert props["model_alias"] == "alpha"
    async with router.http.put(router.root + "/upstream/echo/slots/0?action=save",
                               data=b"x", headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200
    assert router.echo.received[-1]["method"] == "PUT"
    assert router.echo.received[-1]["path"] == "/slots/0?action=save"
    assert router.requests(model="alpha", code="200", api="upstream") == 1


@pytest.mark.parametrize("router", [{"defaultRoute": "echo"}], indirect=True)
async def test_a_request_with_no_model_goes_to_the_default_route(router: Router) -> None:
    status, echoed = await router.post("/v1/messages/count_tokens", b'{"messages": []}')
    assert status == 200 and echoed["path"] == "/v1/messages/count_tokens"
    form = aiohttp.FormData()
    form.add_field("file", b"RIFF", filename="a.wav")
    async with router.http.post(router.root + "/v1/audio/transcriptions", data=form,
                                headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200


def _form(fields: dict[str, str]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=fields,
                            files={"file": ("a.wav", b"RIFF")})
    return request.read(), request.headers["content-type"]


async def test_bad_input_is_a_4xx_in_the_callers_dialect_and_reaches_no_member(
    router: Router,
) -> None:
    body, content_type = _form({"language": "en"})
    status, error = await router.post("/v1/audio/transcriptions", body,
                                      **{"Content-Type": content_type})
    assert status == 400 and error["error"]["param"] == "model"
    assert "'model'" in error["error"]["message"]

    status, error = await router.post("/v1/audio/transcriptions", b"not a form",
                                      **{"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 400 and "multipart form" in error["error"]["message"]

    status, error = await router.post("/v1/responses", b'{"model": 5, "input": "x"}')
    assert status == 400 and error["error"]["param"] == "model"

    status, error = await router.post("/v1/messages", b'{"model": ["alpha"]}')
    assert status == 400
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "'model'" in error["error"]["message"]

    status, error = await router.post("/v1/messages", json.dumps(
        {"model": "echo", "messages": "x" * 70_000}).encode())
    assert status == 413
    assert error == {"type": "error", "error": {
        "type": "request_too_large",
        "message": "Request body exceeds the router's limit of 65536 bytes."}}

    status, error = await router.post("/v1/responses", b'{"model": "echo", "input": "' +
                                      b"x" * 70_000 + b'"}')
    assert status == 413 and error["error"]["code"] == "request_too_large"

    status, error = await router.post("/v1/messages", b'{"model": "alpha"')
    assert status == 400 and error["error"]["type"] == "invalid_request_error"

    async with router.http.get(router.root + "/upstream/ghost/props",
                               headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "backend_not_found"

    async with router.http.get(router.root + "/v1/messages",
                               headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 405 and r.headers["Allow"] == "POST"
        assert (await r.json())["error"]["type"] == "invalid_request_error"

    assert router.echo.received == []
