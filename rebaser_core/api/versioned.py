"""A small framework for versioned wire messages.

A *message type* (``EnqueueUpdatesRequest``) has numbered *versions*, each a frozen pydantic model that
subclasses :class:`MessageVersion`. Every version but the newest implements ``upgrade()`` to the next version,
so any version a peer sends is upgraded step by step to the *current* one. Receivers check the headers
(content type, message type, version) before touching the body, so an unsupported message is refused with a
typed error that says which header was wrong, without decoding anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rebaser_core import headers as h
from rebaser_core.api.codec import ContentType, decode_body, encode_body
from rebaser_core.errors import DecodeError, MissingHeader, UnsupportedMessageType, UnsupportedMessageVersion
from rebaser_core.ids import RequestId

__all__ = ["MessageVersion", "Negotiated", "VersionedMessage"]


class MessageVersion(BaseModel):
    """One version of one message type. Subclasses set ``MESSAGE_TYPE`` and ``VERSION``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    MESSAGE_TYPE: ClassVar[str]
    VERSION: ClassVar[int]

    id: RequestId

    def upgrade(self) -> MessageVersion:
        """Return this message as the next version. The current version has nothing to upgrade to."""
        raise NotImplementedError(f"{self.MESSAGE_TYPE} v{self.VERSION} is the current version")


C = TypeVar("C", bound=MessageVersion)


class Negotiated:
    """What the headers of an incoming message announce, checked before its body is decoded."""

    __slots__ = ("content_type", "version")

    def __init__(self, content_type: ContentType, version: int) -> None:
        self.content_type = content_type
        self.version = version


class VersionedMessage(Generic[C]):
    """Registry of one message type's versions; the last one given is current."""

    def __init__(self, name: str, versions: Sequence[type[MessageVersion]], current: type[C]) -> None:
        numbers = [v.VERSION for v in versions]
        if numbers != list(range(1, len(versions) + 1)) or versions[-1] is not current:
            raise ValueError(f"{name}: versions must be 1..n in order with the current one last")
        if any(name != v.MESSAGE_TYPE for v in versions):
            raise ValueError(f"{name}: every version must carry MESSAGE_TYPE {name!r}")
        self.name = name
        self.current: type[C] = current
        self._versions: dict[int, type[MessageVersion]] = {v.VERSION: v for v in versions}
        # The version header's text -> its number. Looked up as text: no int() of attacker-sized digit strings,
        # and "01" is not "1".
        self._by_text: dict[str, int] = {str(v): v for v in self._versions}

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(self._versions)

    def version_class(self, version: int) -> type[MessageVersion]:
        return self._versions[version]

    # -- sending -------------------------------------------------------------------------------------
    def encode(
        self,
        message: MessageVersion,
        content_type: ContentType = ContentType.CBOR,
        *,
        reply_inbox: str | None = None,
    ) -> tuple[dict[str, str], bytes]:
        """Headers and body for ``message`` (any registered version; normally the current one)."""
        if type(message) is not self._versions.get(message.VERSION):
            raise TypeError(f"{type(message).__name__} is not a version of {self.name}")
        headers = {
            h.CONTENT_TYPE: content_type.value,
            h.MESSAGE_TYPE: self.name,
            h.MESSAGE_VERSION: str(message.VERSION),
            h.NATS_MSG_ID: str(message.id),
        }
        if reply_inbox is not None:
            headers[h.REPLY_INBOX] = reply_inbox
        # The serializer itself: model_dump's keyword handling around it is a measurable part of encoding a request.
        data = message.__pydantic_serializer__.to_python(message, mode="json")
        return headers, encode_body(data, content_type)

    # -- receiving -----------------------------------------------------------------------------------
    def negotiate(self, headers: Mapping[str, str] | None) -> Negotiated:
        """Check content type, message type and version from the headers alone.

        Raises :class:`HeadersTooLarge`, :class:`MissingHeader`, :class:`UnsupportedContentType`,
        :class:`UnsupportedMessageType` or :class:`UnsupportedMessageVersion`. A missing content type means the
        default, CBOR.
        """
        h.check_header_block(headers)  # bounded before anything is looked at (HeadersTooLarge)
        content_type = ContentType.parse(h.get_header(headers, h.CONTENT_TYPE) or ContentType.CBOR.value)
        message_type = h.get_header(headers, h.MESSAGE_TYPE)
        if message_type is None:
            raise MissingHeader(h.MESSAGE_TYPE)
        if message_type != self.name:
            raise UnsupportedMessageType(message_type, self.name)
        raw_version = h.get_header(headers, h.MESSAGE_VERSION)
        if raw_version is None:
            raise MissingHeader(h.MESSAGE_VERSION)
        version = self._by_text.get(raw_version)
        if version is None:
            raise UnsupportedMessageVersion(self.name, raw_version, self.versions)
        return Negotiated(content_type, version)

    def decode_version(self, body: bytes, negotiated: Negotiated) -> MessageVersion:
        """Decode the body as the version the headers announced, without upgrading it."""
        data = decode_body(body, negotiated.content_type)
        cls = self._versions[negotiated.version]
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise DecodeError(
                f"body is not a valid {self.name} v{negotiated.version}: {_summary(err)}"
            ) from None

    def upgrade(self, message: MessageVersion) -> C:
        """Upgrade any version step by step to the current one."""
        while not isinstance(message, self.current):
            message = message.upgrade()
        return message

    def decode(self, headers: Mapping[str, str] | None, body: bytes) -> C:
        """Negotiate, decode and upgrade; every failure is a :class:`~rebaser_core.errors.ProtocolError`."""
        return self.upgrade(self.decode_version(body, self.negotiate(headers)))


def _summary(err: ValidationError) -> str:
    parts: list[str] = []
    for e in err.errors()[:3]:
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        parts.append(f"{loc}: {e['msg']}")
    more = err.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
