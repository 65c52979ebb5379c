"""DNS steering: the record's codec, the AXFR reader, the ECS sampler, and the dns.steer.* actions."""

__all__: list[str] = []
