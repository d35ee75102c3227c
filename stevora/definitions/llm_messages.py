"""An `llm` step's messages: a string, or a user message's list of parts (text, images, files:
docs/providers.md, "Images and files")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from stevora.attachments import Attachment, AttachmentError, AttachmentKind, decode_base64
from stevora.definitions.retry import CamelModel


class TextPart(CamelModel):
    """A piece of text in a message's content (templated)."""

    type: Literal["text"]
    text: str


class ImagePart(CamelModel):
    """An image: base64 `data` with its `mediaType`, or a `url` the provider fetches. `data` and
    `mediaType` may be templates (`{{input.screenshot}}`), checked when the step runs."""

    type: Literal["image"]
    media_type: str | None = Field(default=None, max_length=100)
    data: str | None = None
    url: str | None = Field(default=None, max_length=4096, pattern=r"^(https?://|\{\{)")

    @field_validator("data")
    @classmethod
    def _data_is_an_image(cls, data: str | None, info: ValidationInfo) -> str | None:
        if data is not None:
            _check_inline_attachment("image", info.data.get("media_type"), data)
        return data

    @model_validator(mode="after")
    def _data_or_url(self) -> ImagePart:
        if (self.data is None) == (self.url is None):
            raise PydanticCustomError("image_source", "An image part has either data (with mediaType) or url")
        return self


class FilePart(CamelModel):
    """A file (a PDF: `mediaType: "application/pdf"`) as base64 `data`; both may be templates."""

    type: Literal["file"]
    media_type: str = Field(max_length=100)
    data: str

    @field_validator("data")
    @classmethod
    def _data_is_a_file(cls, data: str, info: ValidationInfo) -> str:
        _check_inline_attachment("file", info.data.get("media_type"), data)
        return data


def _check_inline_attachment(kind: AttachmentKind, media_type: str | None, data: str) -> None:
    """Data written into the definition is checked now; templated data when the step runs."""
    if media_type is None:
        raise PydanticCustomError("media_type_missing", "Data needs its mediaType")
    if "{{" in media_type or "{{" in data:
        return
    try:
        Attachment.of(kind, media_type, decode_base64(data))
    except AttachmentError as exc:
        raise PydanticCustomError("attachment_invalid", "{reason}", {"reason": str(exc)}) from exc


_PART_TYPES = ("text", "image", "file")


def _part_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _PART_TYPES else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("text")] | Annotated[ImagePart, Tag("image")] | Annotated[FilePart, Tag("file")],
    Discriminator(
        _part_kind,
        custom_error_type="part_type",
        custom_error_message="A content part's type is text, image or file",
    ),
]
MessageContent = Annotated[
    Annotated[str, Tag("text")]
    | Annotated[Annotated[list[ContentPart], Field(min_length=1, max_length=100)], Tag("parts")],
    Discriminator(lambda value: "parts" if isinstance(value, list) else "text"),
]


class LlmMessage(CamelModel):
    """One conversation message; `content` may hold `{{input.x}}` / `{{state.x}}` templates. A user
    message's content may be a list of parts: text, images and files (docs/providers.md)."""

    role: Literal["system", "user", "assistant"]
    content: MessageContent

    @model_validator(mode="after")
    def _parts_are_for_users(self) -> LlmMessage:
        if not isinstance(self.content, str) and self.role != "user":
            raise PydanticCustomError(
                "parts_need_user", "Only a user message's content may be a list of parts"
            )
        return self
