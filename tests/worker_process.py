"""A worker process for durability tests: the real worker plus the test-only actions."""

from __future__ import annotations

import asyncio
import sys

from runtime.connection import connect
from tests import support


async def main(address: str, queue: str) -> None:
    client = await connect(target_host=address, namespace="default")
    async with support.worker(client, queue):
        print("worker ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
