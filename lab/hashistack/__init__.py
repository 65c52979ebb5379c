"""Real Consul, Nomad and Vault (or OpenBao) for the lab and the tests: finding the binaries, their configs, starting them."""

from lab.hashistack.binaries import Backends, backends, binary
from lab.hashistack.config import ConsulAgent, NomadAgent, VaultServer

__all__ = ["Backends", "ConsulAgent", "NomadAgent", "VaultServer", "backends", "binary"]
