"""Attachments as hostile input: strict base64, the media-type allow-list, magic bytes, size."""

from __future__ import annotations

import base64

import pytest

from stevora import File, Image
from stevora.attachments import (
    Attachment,
    AttachmentError,
    attachment_refs,
    decode_base64,
    with_attachment_blocks,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
PDF = b"%PDF-1.4\n%%EOF"


@pytest.mark.parametrize(
    "text",
    ["aGVsbG8", "aGVs\nbG8=", "aGVs bG8=", "aGVsbG8=\n", "aGVs_G8=", "====", "aGVsbG8=x"],
)
def test_base64_that_is_not_strict_is_refused(text: str) -> None:
    with pytest.raises(AttachmentError):
        decode_base64(text)


def test_strict_base64_decodes() -> None:
    assert decode_base64(base64.b64encode(PNG).decode()) == PNG


@pytest.mark.parametrize(
    ("kind", "media_type", "data", "said"),
    [
        ("image", "image/svg+xml", b"<svg onload=alert(1)>", "not one of"),
        ("image", "text/html", PNG, "not one of"),
        ("image", "image/jpeg", PNG, "not a image/jpeg file"),
        ("file", "application/pdf", PNG, "not a application/pdf file"),
        ("file", "image/png", PNG, "not one of"),
        ("image", "image/png", b"", "empty"),
    ],
)
def test_a_media_type_off_the_list_or_bytes_that_are_not_that_type_are_refused(
    kind: str, media_type: str, data: bytes, said: str
) -> None:
    with pytest.raises(AttachmentError, match=said):
        Attachment.of(kind, media_type, data)  # type: ignore[arg-type]


def test_an_attachment_over_the_limit_is_refused_naming_both_sizes() -> None:
    with pytest.raises(AttachmentError, match=f"{len(PNG)} bytes, over the 10-byte limit"):
        Attachment.of("image", "image/png", PNG, max_bytes=10)


def test_a_tools_images_and_files_become_blocks_named_by_hash_each_once() -> None:
    value, found = with_attachment_blocks(
        {"page": [Image(PNG), "text", Image(PNG)], "doc": File(PDF)}, max_bytes=None
    )
    png, pdf = found
    assert value == {"page": [png.block(), "text", png.block()], "doc": pdf.block()}
    assert png.block() == {"type": "image", "mediaType": "image/png", "bytes": len(PNG), "sha256": png.sha256}
    assert [r.sha256 for r in attachment_refs(value)] == [png.sha256, png.sha256, pdf.sha256]


def test_blocks_with_a_bad_hash_or_type_name_nothing() -> None:
    good = "a" * 64
    assert attachment_refs({"type": "image", "mediaType": "image/png", "sha256": good}) != []
    for block in (
        {"type": "image", "mediaType": "image/png", "sha256": "../etc"},
        {"type": "image", "mediaType": "image/svg+xml", "sha256": good},
        {"type": "audio", "mimeType": "audio/wav", "sha256": good},
        {"type": "file", "mediaType": "image/png", "sha256": good},
    ):
        assert attachment_refs(block) == []
