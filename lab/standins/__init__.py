"""API-faithful Consul and Nomad stand-ins for the drill lab (its Vault is always real)."""

__all__ = ["clock", "consul", "nomad"]
