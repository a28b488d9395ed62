"""The call wrapper every program's kube module sends its requests through.

One `Client` holds one kr8s `Api` (injected; `connect` makes one) and the program's error
vocabulary: `refused` turns a refusal of the API server into the program's error, and
`failed` an error of the transport (kr8s, httpx, the socket). Every call goes through
`call`: kr8s never reads a refusal itself, and a 401 renews the token on the same session
(`kubecore.refusal` says why). On top of it, a JSON request and a watch's stream of
events, whose ERROR events are refusals too.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NoReturn

import kr8s.asyncio

from kubecore import handshake
from kubecore.refusal import Refusal, answer, renew_token, status_refusal

Json = dict[str, Any]
Refused = Callable[[Refusal, str], Exception]
Failed = Callable[[Exception, str], Exception]


async def connect(kubeconfig: str | None = None) -> Any:
    """A kr8s client of the caller's own from `kubeconfig`, else KUBECONFIG or the pod's
    service account.

    Not kr8s's cached one: `kr8s.asyncio.api` hands every caller of one thread and event
    loop the same client for the same arguments, so one owner's `close` would close the
    HTTP session under another's requests in flight (a test and the program it runs in its
    own event loop), and their next calls would race to open a new one, leaking the
    other's connections."""
    handshake.install()
    api = kr8s.asyncio.Api(kubeconfig=kubeconfig, bypass_factory=True)
    _forget(api)
    return await api


def _forget(api: Any) -> None:
    """Take `api` out of kr8s's cache, where its constructor put it."""
    for entries in getattr(type(api), "_instances", {}).values():
        for key in [k for k, v in list(entries.items()) if v is api]:
            del entries[key]


async def close(api: Any) -> None:
    """Close a kr8s client's HTTP session (kr8s keeps it open for the client's life)."""
    session = getattr(api, "_session", None)
    if session is not None:
        await session.aclose()


@contextlib.asynccontextmanager
async def opened(kubeconfig: str) -> AsyncIterator[Any]:
    """A kr8s client for `kubeconfig`, closed after: for a caller whose event loops come and
    go (a test's), where the programs keep one."""
    api = await connect(kubeconfig)
    try:
        yield api
    finally:
        await close(api)


class Client:
    """Calls on one kr8s `Api`, answered in the program's own errors."""

    def __init__(self, api: Any, refused: Refused, failed: Failed) -> None:
        self.api = api
        self._refused = refused
        self._failed = failed

    @contextlib.asynccontextmanager
    async def call(self, what: str, method: str, **kwargs: Any) -> AsyncIterator[Any]:
        """The response of `api.call_api`, with kr8s's reading of a refusal turned off: an
        error status raises the program's error for it here."""
        async with answer(
            lambda: self.api.call_api(method, raise_for_status=False, **kwargs),
            lambda refusal: self._refused(refusal, what),
            functools.partial(renew_token, self.api),
        ) as response:
            yield response

    async def json(
        self,
        what: str,
        method: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> Any:
        """The parsed answer to one request (`{}` when it has no body); `body` goes as
        JSON of `content_type`. A failure raises the program's error for it."""
        if params:
            kwargs["params"] = dict(params)
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        try:
            async with self.call(what, method, **kwargs) as response:
                return response.json() if response.content else {}
        except Exception as e:
            self._raise_failed(e, what)

    async def events(self, what: str, **kwargs: Any) -> AsyncIterator[tuple[str, Json]]:
        """(type, object) of a watch (GET with the query of `kubecore.watch.watch_params`)
        until the server ends it; an ERROR event raises the program's error for its
        refusal (410 Gone when the version is too old)."""
        try:
            async with self.call(what, "GET", stream=True, **kwargs) as response:
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        raise self._refused(status_refusal(obj), what)
                    yield str(event.get("type")), obj
        except Exception as e:
            self._raise_failed(e, what)

    def _raise_failed(self, error: Exception, what: str) -> NoReturn:
        translated = self._failed(error, what)
        if translated is error:
            raise error
        raise translated from error

    async def close(self) -> None:
        await close(self.api)
