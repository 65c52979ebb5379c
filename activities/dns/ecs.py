"""Sample a steering name as many clients: one ECS subnet per simulated client, over one UDP socket."""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
from typing import Any

import dns.edns
import dns.exception
import dns.message
import dns.rdatatype
import dns.rdtypes.IN.A

from activities.contracts.dns import parse_server

__all__ = ["query_clients"]


class _Replies(asyncio.DatagramProtocol):
    """Matches replies on one shared UDP socket to waiting queries by ID and echoed ECS subnet."""

    def __init__(self) -> None:
        self.waiting: dict[int, tuple[asyncio.Future[dns.message.Message], str]] = {}

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            msg = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return
        entry = self.waiting.get(msg.id)
        if entry is None:
            return
        future, subnet = entry
        # A late reply to an earlier use of this ID carries another subnet: ignore it.
        if _ecs_of(msg) == subnet and not future.done():
            future.set_result(msg)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors carry no query ID; the per-query timeout handles the loss.
        pass


def _ecs_of(msg: dns.message.Message) -> str | None:
    for opt in msg.options:
        if isinstance(opt, dns.edns.ECSOption):
            return f"{opt.address}/{opt.srclen}"
    return None


async def query_clients(
    server: str,
    fqdn: str,
    subnets: list[ipaddress.IPv4Network],
    *,
    concurrency: int = 64,
    timeout: float = 1.0,
    attempts: int = 3,
) -> list[str | None]:
    """Ask for `fqdn` A once per client subnet (as ECS); returns each client's first address or None.

    One UDP socket for all queries keeps 10k queries cheap; the semaphore bounds how
    many are in flight so the server's receive buffer is never the thing being measured.
    """
    host, port = parse_server(server)
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(_Replies, remote_addr=(host, port))
    ids = itertools.count()
    gate = asyncio.Semaphore(concurrency)

    def next_id() -> int:
        while True:
            qid = next(ids) & 0xFFFF
            if qid not in proto.waiting:
                return qid

    async def ask(subnet: ipaddress.IPv4Network) -> str | None:
        key = f"{subnet.network_address}/{subnet.prefixlen}"
        async with gate:
            for _ in range(attempts):
                qid = next_id()
                query = dns.message.make_query(
                    fqdn, dns.rdatatype.A, use_edns=0,
                    options=[dns.edns.ECSOption(str(subnet.network_address), subnet.prefixlen)],
                )
                query.id = qid
                future: asyncio.Future[dns.message.Message] = loop.create_future()
                proto.waiting[qid] = (future, key)
                try:
                    transport.sendto(query.to_wire())
                    reply = await asyncio.wait_for(future, timeout)
                except TimeoutError:
                    continue
                finally:
                    proto.waiting.pop(qid, None)
                for rrset in reply.answer:
                    if rrset.rdtype == dns.rdatatype.A and isinstance(a := rrset[0], dns.rdtypes.IN.A.A):
                        return a.address
                return None
            return None

    try:
        return list(await asyncio.gather(*(ask(s) for s in subnets)))
    finally:
        transport.close()
