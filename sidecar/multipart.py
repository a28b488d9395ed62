"""One text field of a `multipart/form-data` body (RFC 7578), read without copying the rest.

An audio transcription names its model as a form field beside the file, which may be many
megabytes: the parts are found by searching for the boundary, and only the headers of each
part and the value of the field asked for are decoded.
"""

from __future__ import annotations


class FormError(ValueError):
    """The body is not the multipart form its Content-Type says."""


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a `multipart/form-data` Content-Type; FormError for any other."""
    if content_type is None:
        raise FormError("the request has no Content-Type; send multipart/form-data")
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise FormError(f"Content-Type is {kind.strip() or 'empty'!r}, not multipart/form-data")
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "boundary":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if 1 <= len(value) <= 70:
                return value.encode("latin-1", "replace")
            break
    raise FormError("the multipart/form-data Content-Type has no valid boundary")


def form_field(body: bytes, content_type: str | None, name: str) -> str | None:
    """The value of the form field `name` (not a file), or None where the form has none.
    FormError where the body is not a well-formed multipart form."""
    delimiter = b"--" + boundary_of(content_type)
    start = body.find(delimiter)
    if start < 0:
        raise FormError("the body does not contain the boundary its Content-Type names")
    wanted = name.encode()
    position = start + len(delimiter)
    while True:
        if body.startswith(b"--", position):  # the close delimiter: no more parts
            return None
        head_start = body.find(b"\r\n", position)
        if head_start < 0:
            raise FormError("a part of the form is cut short")
        head_end = body.find(b"\r\n\r\n", head_start)
        if head_end < 0:
            raise FormError("a part of the form has no end to its headers")
        next_delimiter = body.find(b"\r\n" + delimiter, head_end + 4)
        if next_delimiter < 0:
            raise FormError("the form has no closing boundary")
        field, is_file = _disposition(body[head_start + 2:head_end])
        if field == wanted and not is_file:
            value = body[head_end + 4:next_delimiter]
            try:
                return value.decode()
            except UnicodeDecodeError as e:
                raise FormError(f"the form field {name!r} is not UTF-8 text") from e
        position = next_delimiter + 2 + len(delimiter)


def _disposition(head: bytes) -> tuple[bytes | None, bool]:
    """The part's field name and whether it carries a file, from its headers."""
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() != b"content-disposition":
            continue
        field: bytes | None = None
        is_file = False
        for param in value.split(b";")[1:]:
            k, _, v = param.strip().partition(b"=")
            k = k.strip().lower()
            v = v.strip()
            if len(v) >= 2 and v[:1] == v[-1:] == b'"':
                v = v[1:-1]
            if k == b"name":
                field = v
            elif k in (b"filename", b"filename*"):
                is_file = True
        return field, is_file
    return None, False
