"""Lab hosts (network namespaces, sshd) and the firewall actions run against them."""
