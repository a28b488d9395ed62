"""The query of a Kubernetes watch, as every program here opens one: from a version on,
bookmarks included, ended by the server after `timeout_seconds` so that a dead connection
shows as a missing end rather than as silence. Only the query: each program's own kube
module sends it."""

from __future__ import annotations


def watch_params(
    resource_version: str,
    timeout_seconds: int,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
) -> dict[str, str]:
    params = {
        "watch": "true",
        "resourceVersion": resource_version,
        "allowWatchBookmarks": "true",
        "timeoutSeconds": str(timeout_seconds),
    }
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params
