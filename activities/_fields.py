"""Field types the actions' input models share: base URLs, absolute DNS names, IPv4 addresses, unique names."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

import dns.exception
import dns.name
from pydantic import AfterValidator, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = ["AbsoluteName", "BaseUrl", "IPv4", "unique_names"]


def _base_url(value: str) -> str:
    value = value.strip().rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    if parts.path not in ("", "/"):
        raise ValueError(f"{value!r}: give the agent's base URL, without a path")
    return value


def _absolute(text: str) -> str:
    # dnspython's name errors are not ValueErrors; pydantic only turns ValueErrors into messages.
    try:
        return dns.name.from_text(text).to_text()
    except dns.exception.DNSException as exc:
        raise ValueError(f"bad DNS name {text!r}: {exc}") from None


def _ipv4(text: str) -> str:
    return str(ipaddress.IPv4Address(text.strip()))


@dataclass(frozen=True)
class _Format:
    """Names the string's format in the JSON schema, which `coldstart actions` shows as the field's type."""

    format: str

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "format": self.format}


BaseUrl = Annotated[str, AfterValidator(_base_url), _Format("uri")]
AbsoluteName = Annotated[str, AfterValidator(_absolute), _Format("hostname")]
IPv4 = Annotated[str, AfterValidator(_ipv4), _Format("ipv4")]


def unique_names(what: str) -> AfterValidator:
    """For a list of named entries (hosts, services): the same name twice is an error."""

    def check(items: list[Any]) -> list[Any]:
        names = [item.name for item in items]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate {what} names: {dupes[:20]}")
        return items

    return AfterValidator(check)
