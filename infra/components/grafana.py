"""Grafana: one data source per Prometheus replica, the recovery dashboard, and a who-watches-the-watcher rule."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumiverse_grafana as grafana

from infra.telemetry.dashboard import recovery_dashboard
from infra.telemetry.thresholds import AlertThresholds

__all__ = ["RecoveryDashboards", "RecoveryDashboardsArgs"]

FOLDER_UID = "coldstart"
CONTACT_POINT = "coldstart-telemetry-meta"


@dataclass
class RecoveryDashboardsArgs:
    # replica name -> Prometheus base URL (http://IP:9090), never a Consul name.
    prometheus_urls: dict[str, str]
    paging_webhook_url: pulumi.Input[str]
    thresholds: AlertThresholds = field(default_factory=AlertThresholds)


class RecoveryDashboards(pulumi.ComponentResource):
    """Dashboards and Grafana-managed alert rules, created through the given Grafana provider."""

    def __init__(self, name: str, args: RecoveryDashboardsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("coldstart:telemetry:RecoveryDashboards", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.folder = grafana.oss.Folder(f"{name}-folder", title="coldstart", uid=FOLDER_UID, opts=child)

        self.datasources: dict[str, grafana.oss.DataSource] = {}
        for i, (replica, url) in enumerate(sorted(args.prometheus_urls.items())):
            self.datasources[replica] = grafana.oss.DataSource(
                f"{name}-ds-{replica}",
                name=f"coldstart-telemetry-{replica}",
                uid=f"coldstart-telemetry-{replica}",
                type="prometheus",
                url=url,
                is_default=(i == 0),
                json_data_encoded=json.dumps({"httpMethod": "POST", "timeInterval": "15s"}),
                opts=child,
            )
        primary_uid = f"coldstart-telemetry-{min(args.prometheus_urls)}"
        self.dashboard = grafana.oss.Dashboard(
            f"{name}-recovery",
            folder=self.folder.uid,
            config_json=json.dumps(recovery_dashboard(primary_uid, args.thresholds), sort_keys=True),
            overwrite=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(self.datasources.values())),
        )

        # Prometheus cannot page about its own death. Grafana asks each replica for vector(1) and pages
        # through the same (secret) webhook when one stops answering: no data or an error both alert.
        self.contact_point = grafana.alerting.ContactPoint(
            f"{name}-contact",
            name=CONTACT_POINT,
            webhooks=[grafana.alerting.ContactPointWebhookArgs(url=pulumi.Output.secret(args.paging_webhook_url))],
            opts=child,
        )
        rules = [self._replica_rule(replica, ds) for replica, ds in sorted(self.datasources.items())]
        self.rule_group = grafana.alerting.RuleGroup(
            f"{name}-meta-rules",
            name="coldstart-telemetry-meta",
            folder_uid=self.folder.uid,
            interval_seconds=60,
            rules=rules,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.contact_point]),
        )
        self.register_outputs({"dashboardUid": self.dashboard.uid, "folderUid": self.folder.uid})

    @staticmethod
    def _replica_rule(replica: str, ds: grafana.oss.DataSource) -> grafana.alerting.RuleGroupRuleArgs:
        window = grafana.alerting.RuleGroupRuleDataRelativeTimeRangeArgs(from_=300, to=0)
        return grafana.alerting.RuleGroupRuleArgs(
            name=f"PrometheusReplicaUnreachable {replica}",
            condition="B",
            for_="2m",
            no_data_state="Alerting",
            exec_err_state="Alerting",
            labels={"severity": "critical", "team": "platform", "replica": replica},
            annotations={
                "summary": f"Prometheus replica {replica} is not answering Grafana",
                "description": "This replica's gates and alerts are blind. Check the host and the "
                               "prometheus unit; its peer still evaluates the same rules.",
                "runbook_url": "infra/README.md#prometheusreplicaunreachable",
            },
            notification_settings=grafana.alerting.RuleGroupRuleNotificationSettingsArgs(contact_point=CONTACT_POINT),
            datas=[
                grafana.alerting.RuleGroupRuleDataArgs(
                    ref_id="A",
                    datasource_uid=ds.uid,
                    relative_time_range=window,
                    model=json.dumps({"refId": "A", "expr": "vector(1)", "instant": True}),
                ),
                grafana.alerting.RuleGroupRuleDataArgs(
                    ref_id="B",
                    datasource_uid="__expr__",
                    relative_time_range=window,
                    model=json.dumps({
                        "refId": "B", "type": "threshold", "expression": "A",
                        "conditions": [{"evaluator": {"type": "lt", "params": [1]}}],
                    }),
                ),
            ],
        )
