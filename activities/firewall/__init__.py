"""Firewall: the iptables model and parser of the block, and the firewall.* actions that converge it."""

__all__: list[str] = []
