"""Connecting to Temporal the same way everywhere: envconfig profiles, TEMPORAL_* variables, pydantic payloads."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, urlsplit

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from runtime.queues import DEFAULT_TASK_QUEUE, TASK_QUEUE_ENV, task_queue

__all__ = ["DATA_CONVERTER", "DEFAULT_TASK_QUEUE", "TASK_QUEUE_ENV", "WEB_UI_ENV", "connect", "task_queue", "web_ui_url"]

# Pydantic models in and out of every workflow and action; one converter for workers and clients.
DATA_CONVERTER = pydantic_data_converter


async def connect(profile: str | None = None, *, runtime: Runtime | None = None, ready_within: float = 0.0,
                  **overrides: Any) -> Client:
    """Connect using the envconfig profile (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_PROFILE, config file).

    ready_within: keep trying this many seconds (a server just started opens its port before its
    frontend is healthy, and the first connect fails with "Frontend is not healthy yet").
    """
    config = ClientConfig.load_client_connect_config(profile=profile or os.environ.get("TEMPORAL_PROFILE"))
    config.setdefault("target_host", "localhost:7233")
    # Client.connect's keywords: the profile's, then the caller's.
    options: dict[str, Any] = {**config, **overrides}
    if runtime is not None:
        options["runtime"] = runtime
    attempts = AsyncRetrying(retry=retry_if_exception_type(RuntimeError), stop=stop_after_delay(ready_within),
                             wait=wait_fixed(0.2), reraise=True)
    return await attempts(Client.connect, data_converter=DATA_CONVERTER, **options)


# Where the Temporal Web UI is: host:port or a URL. Unset: the frontend's host on 8233, where `coldstart server`
# (and `temporal server start-dev`) serve it.
WEB_UI_ENV = "COLDSTART_WEB_UI"
_WEB_UI_PORT = 8233


def web_ui_url(client: Client, workflow_id: str, run_id: str | None = None) -> str:
    """The run's page in the Temporal Web UI: http://<ui>/namespaces/<ns>/workflows/<workflow id>/<run id>."""
    base = os.environ.get(WEB_UI_ENV, "").strip().rstrip("/")
    if not base:
        host = urlsplit(f"//{client.service_client.config.target_host}").hostname or "localhost"
        base = f"{'[' + host + ']' if ':' in host else host}:{_WEB_UI_PORT}"
    if "://" not in base:
        base = f"http://{base}"
    page = f"{base}/namespaces/{quote(client.namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"
    return f"{page}/{quote(run_id, safe='')}" if run_id else page
