"""Which API a request speaks, told by its path alone.

The router routes every request that names a `model` on a path some member runtime serves
(llama-server, vLLM, SGLang): the OpenAI paths, the Responses and Anthropic Messages
families, rerank and score, audio, tokenize and its kin, infill. Each path belongs to one
`Api`: the bounded `api` label of the request metrics, the dialect of the router's own
answers (the Anthropic error shape on the Messages paths, the OpenAI one elsewhere), whether
the body is a `multipart/form-data` form (audio), and which visible delta a held stream may
write. Any other path of a member is reached through the door `/upstream/{backend}/...`.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

OPENAI = "openai"
ANTHROPIC = "anthropic"

# The `api` label's values: a closed set, whatever paths clients send.
LABELS = ("chat", "completions", "embeddings", "responses", "messages", "rerank", "audio",
          "tokenize", "upstream", "other")


@dataclass(frozen=True, slots=True)
class Api:
    label: str
    dialect: str = OPENAI
    form: bool = False  # the body is multipart/form-data; `model` is one of its fields
    # The visible delta a held stream writes with `heldStreamProgress: content`, where the
    # API's stream carries text: "chat", "text", or None (comments only).
    delta: str | None = None


CHAT = Api("chat", delta="chat")
COMPLETIONS = Api("completions", delta="text")
EMBEDDINGS = Api("embeddings")
RESPONSES = Api("responses")
MESSAGES = Api("messages", dialect=ANTHROPIC)
RERANK = Api("rerank")
AUDIO = Api("audio", form=True)
SPEECH = Api("audio")  # text to speech takes a JSON body
TOKENIZE = Api("tokenize")
OTHER = Api("other")
UPSTREAM = Api("upstream")

ROUTED: Mapping[str, Api] = {
    "/v1/chat/completions": CHAT,
    "/chat/completions": CHAT,
    "/v1/chat/completions/input_tokens": CHAT,
    "/chat/completions/input_tokens": CHAT,
    "/v1/completions": COMPLETIONS,
    "/completions": COMPLETIONS,
    "/completion": COMPLETIONS,
    "/infill": COMPLETIONS,
    "/v1/embeddings": EMBEDDINGS,
    "/embeddings": EMBEDDINGS,
    "/embedding": EMBEDDINGS,
    "/v1/responses": RESPONSES,
    "/responses": RESPONSES,
    "/v1/responses/input_tokens": RESPONSES,
    "/responses/input_tokens": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": MESSAGES,
    "/v1/rerank": RERANK,
    "/rerank": RERANK,
    "/v1/reranking": RERANK,
    "/reranking": RERANK,
    "/v2/rerank": RERANK,
    "/v1/score": RERANK,
    "/score": RERANK,
    "/v1/audio/transcriptions": AUDIO,
    "/audio/transcriptions": AUDIO,
    "/v1/audio/translations": AUDIO,
    "/v1/audio/speech": SPEECH,
    "/tokenize": TOKENIZE,
    "/detokenize": TOKENIZE,
    "/apply-template": TOKENIZE,
    "/pooling": OTHER,
    "/classify": OTHER,
}

UPSTREAM_PREFIX = "/upstream/"


def api_of(path: str) -> Api | None:
    """The API a path routed by `model` belongs to; None for a path the router does not
    route that way."""
    return ROUTED.get(path)


@dataclass(frozen=True, slots=True)
class UpstreamDoor:
    backend: str
    target: str  # the member's path and query, as the client sent them after the backend


def upstream_door(path: str, target: str) -> UpstreamDoor | None:
    """`/upstream/{backend}/{rest}`: the backend named (percent-decoded) and `/{rest}` with
    the query as sent; None for a path outside the door. A door with no backend named, or
    with a `..` segment in what follows, names nothing (`UpstreamDoor("", ...)`), which the
    caller answers as an unknown backend."""
    if not path.startswith(UPSTREAM_PREFIX):
        return None
    rest = path[len(UPSTREAM_PREFIX):]
    name, slash, tail = rest.partition("/")
    query = target.find("?")
    suffix = "" if query < 0 else target[query:]
    if ".." in tail.split("/"):
        return UpstreamDoor("", "/")
    return UpstreamDoor(urllib.parse.unquote(name), "/" + tail + suffix if slash else "/" + suffix)
