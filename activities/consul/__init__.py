"""Consul: the KV core, the snapshot archive reader, and the action modules built on them."""

__all__: list[str] = []
