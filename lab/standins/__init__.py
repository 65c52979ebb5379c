"""API-faithful Consul, Nomad and Vault stand-ins for the drill lab."""

__all__ = ["clock", "consul", "nomad", "vault"]
