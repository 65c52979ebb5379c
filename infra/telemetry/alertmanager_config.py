"""Renders alertmanager.yml: page through a webhook held as a Pulumi secret, never a Vault path."""

from __future__ import annotations

__all__ = ["render_alertmanager_config"]


def render_alertmanager_config(paging_webhook_url: str, heartbeat_webhook_url: str | None = None, *,
                               trigger_webhook_url: str | None = None,
                               trigger_token_file: str | None = None) -> dict:
    """alertmanager.yml as a dict. The result contains the secret URL: keep it wrapped as a secret.

    trigger_webhook_url: coldstart's alert trigger (`coldstart triggers serve`, POST /alerts); the
    preemption notice goes there at once (and still pages), with the bearer token in trigger_token_file.
    """
    receivers: list[dict] = [
        {"name": "page", "webhook_configs": [{"url": paging_webhook_url, "send_resolved": True}]},
        # Alerts with severity none (the Watchdog) must not page anyone.
        {"name": "null"},
    ]
    watchdog_receiver = "null"
    if heartbeat_webhook_url:
        receivers.append(
            {"name": "heartbeat", "webhook_configs": [{"url": heartbeat_webhook_url, "send_resolved": False}]}
        )
        watchdog_receiver = "heartbeat"
    trigger_routes: list[dict] = []
    if trigger_webhook_url:
        if not trigger_token_file:
            raise ValueError("trigger_webhook_url needs trigger_token_file: the trigger refuses unsigned alerts")
        receivers.append({"name": "coldstart-trigger", "webhook_configs": [{
            "url": trigger_webhook_url, "send_resolved": False,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": trigger_token_file}}}]})
        # A notice leaves 30 s: no grouping wait; `continue` so it still pages the on-call as well.
        trigger_routes.append({"matchers": ['alertname="HostPreemptionNotice"'], "receiver": "coldstart-trigger",
                               "group_by": ["host"], "group_wait": "0s", "group_interval": "5s",
                               "repeat_interval": "1m", "continue": True})
    return {
        "global": {"resolve_timeout": "5m"},
        "route": {
            "receiver": "page",
            "group_by": ["alertname", "job"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                *trigger_routes,
                # The dead man's switch pings often so the external heartbeat notices silence quickly.
                {"matchers": ['alertname="Watchdog"'], "receiver": watchdog_receiver,
                 "group_wait": "0s", "group_interval": "1m", "repeat_interval": "1m"},
                {"matchers": ['severity="critical"'], "receiver": "page", "repeat_interval": "1h"},
                {"matchers": ['severity="warning"'], "receiver": "page", "repeat_interval": "4h"},
                {"matchers": ['severity=~"none|info"'], "receiver": "null"},
            ],
        },
        "inhibit_rules": [
            # With no leader every other Consul symptom is the same problem: page once.
            {"source_matchers": ['alertname="ConsulNoLeader"'],
             "target_matchers": ['alertname=~"Consul.+"', 'alertname!="ConsulNoLeader"']},
            {"source_matchers": ['alertname="ConsulAutopilotUnhealthy"'],
             "target_matchers": ['alertname="ConsulFailureToleranceZero"']},
        ],
        "receivers": receivers,
    }
