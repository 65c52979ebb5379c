"""Field types the actions' input models share: base URLs, absolute DNS names, IPv4 addresses, unique names, KV keys, Go durations."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

import dns.exception
import dns.name
from pydantic import AfterValidator, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = ["AbsoluteName", "BaseUrl", "IPv4", "go_duration_seconds", "kv_key", "unique_names"]


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


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration_seconds(value: Any) -> float:
    """Go duration text ("1m0s", "250ms") or integer nanoseconds (Go JSON) to seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) / 1e9
    text = str(value).strip()
    parts = re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Go duration: {value!r}")
    return sum(float(n) * _GO_UNITS[u] for n, u in parts)


def kv_key(key: str) -> str:
    """A Consul KV key as actions accept it: non-empty, relative, one line."""
    if not key or key.startswith("/") or any(c in key for c in "\n\r\0"):
        raise ValueError(f"bad KV key {key!r}: non-empty, no leading slash, no control characters")
    return key
