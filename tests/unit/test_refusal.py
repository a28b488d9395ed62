"""kubecore.refusal: what an error answer of the API server says, whatever its body, and
how a call is answered: a success as it came, a refusal raised, a 401 renewed once."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from kubecore.refusal import Refusal, answer, read_refusal

pytestmark = pytest.mark.unit


def test_a_status_body_gives_its_reason_and_message() -> None:
    message = ('configmaps "x" is forbidden: unable to create new content in namespace t-1 '
               "because it is being terminated")
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
              "reason": "Forbidden", "message": message}
    refusal = read_refusal(403, json.dumps(status).encode())
    assert refusal == Refusal(403, "Forbidden", message)
    assert str(refusal) == f"HTTP 403: {message}"
    assert not refusal.namespace_terminating


def test_a_namespace_being_deleted_is_named_by_the_status_cause() -> None:
    status = {"kind": "Status", "code": 403, "reason": "Forbidden",
              "message": 'configmaps "x" is forbidden: unable to create new content in '
                         "namespace t-1 because it is being terminated",
              "details": {"name": "x", "kind": "configmaps", "causes": [
                  {"reason": "NamespaceTerminating", "field": "metadata.namespace",
                   "message": "namespace t-1 is being terminated"}]}}
    refusal = read_refusal(403, json.dumps(status).encode())
    assert refusal.causes == ("NamespaceTerminating",)
    assert refusal.namespace_terminating
    odd = {**status, "details": {"causes": "not a list"}}
    assert read_refusal(403, json.dumps(odd).encode()).causes == ()


def test_a_body_that_is_not_a_status_gives_its_start() -> None:
    page = b"<html><body>" + b"x" * 1000 + b"</body></html>"
    refusal = read_refusal(502, page)
    assert (refusal.code, refusal.reason) == (502, "")
    assert refusal.message == page[:300].decode()


@pytest.mark.parametrize("body", [b"", b"{", b'{"message": 7}', b"[1]", b"\xff\xfe"])
def test_an_empty_or_odd_body_still_names_the_status(body: bytes) -> None:
    refusal = read_refusal(401, body)
    assert refusal.code == 401
    assert str(refusal).startswith("HTTP 401")


class Replies:
    """`send` for `answer`: each call opens the next scripted response."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.sent = 0

    @contextlib.asynccontextmanager
    async def send(self) -> AsyncIterator[httpx.Response]:
        self.sent += 1
        code = self.codes.pop(0)
        yield httpx.Response(code, json={"kind": "Status", "message": f"said {code}"})


class Refused(Exception):
    pass


def refused(refusal: Refusal) -> Exception:
    return Refused(str(refusal))


async def test_a_success_is_yielded_as_it_came() -> None:
    replies = Replies(200)
    async with answer(replies.send, refused) as response:
        assert response.status_code == 200


async def test_a_401_renews_the_credentials_once_and_sends_again() -> None:
    renewed: list[bool] = []

    async def renew() -> None:
        renewed.append(True)

    replies = Replies(401, 200)
    async with answer(replies.send, refused, renew) as response:
        assert response.status_code == 200
    assert (replies.sent, renewed) == (2, [True])

    again = Replies(401, 401)
    with pytest.raises(Refused, match="HTTP 401: said 401"):
        async with answer(again.send, refused, renew):
            pass
    assert (again.sent, len(renewed)) == (2, 2)


async def test_without_renew_a_401_is_a_refusal_like_a_403() -> None:
    for code in (401, 403):
        replies = Replies(code)
        with pytest.raises(Refused, match=f"HTTP {code}: said {code}"):
            async with answer(replies.send, refused):
                pass
        assert replies.sent == 1
