"""The lab's sqlite backend: schema, the steering zone with SOA/NS/steering records, and the TSIG key."""

from __future__ import annotations

import ipaddress
import sqlite3
from pathlib import Path

from activities.dns.steering import steering_code
from lab.dns.settings import PdnsSettings
from lab.dns.tsig import TsigKey

__all__ = ["SCHEMA", "create_database"]

SCHEMA = Path("/usr/share/pdns-backend-sqlite3/schema/schema.sqlite3.sql")


def _stored(name: str) -> str:
    # gsqlite3 keeps names lowercase and without the trailing dot.
    return name.rstrip(".").lower()


def create_database(path: Path, settings: PdnsSettings, key: TsigKey, *, schema: Path = SCHEMA) -> None:
    """Create a fresh database; refuses to overwrite so a lab's live state is never clobbered."""
    if path.exists():
        raise FileExistsError(f"{path} exists; use a fresh state dir")
    zone = _stored(settings.zone)
    ns = _stored(settings.absolute(settings.nameserver))
    hostmaster = f"hostmaster.{zone}"
    ttl = 3600
    rows: list[tuple[str, str, str, int]] = [
        # Serial 1; pdns bumps it on UPDATE according to SOA-EDIT-DNSUPDATE.
        (zone, "SOA", f"{ns} {hostmaster} 1 10800 3600 604800 {settings.record_ttl}", ttl),
        (zone, "NS", ns, ttl),
    ]
    bind = ipaddress.ip_address(settings.bind_address)
    if bind.version == 4 and ns.endswith(zone):
        rows.append((ns, "A", str(bind), ttl))
    code = steering_code(settings.game_ip, settings.maint_ip, settings.start_percent)
    for fqdn in settings.steering_fqdns:
        rows.append((_stored(fqdn), "LUA", f'A "{code}"', settings.record_ttl))

    db = sqlite3.connect(path)
    try:
        db.executescript(schema.read_text())
        with db:
            cur = db.execute("INSERT INTO domains (name, type) VALUES (?, 'NATIVE')", (zone,))
            domain_id = cur.lastrowid
            db.executemany(
                "INSERT INTO records (domain_id, name, type, content, ttl, prio, disabled, auth)"
                " VALUES (?, ?, ?, ?, ?, 0, 0, 1)",
                [(domain_id, n, t, c, tt) for n, t, c, tt in rows],
            )
            db.execute(
                "INSERT INTO tsigkeys (name, algorithm, secret) VALUES (?, ?, ?)",
                (_stored(key.name), key.algorithm, key.secret),
            )
            # Every UPDATE bumps the serial, so a read-back can tell which version it saw.
            db.execute(
                "INSERT INTO domainmetadata (domain_id, kind, content) VALUES (?, 'SOA-EDIT-DNSUPDATE', 'INCREASE')",
                (domain_id,),
            )
    finally:
        db.close()
