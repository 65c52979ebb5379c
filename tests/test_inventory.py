"""The inventory contract (activities/inventory.py): the actions' own models, validated with located errors before a run."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from activities.catalog import load_registry
from activities.inventory import Inventory
from workflows.loader import InventoryInvalid, load_inventory, read_inventory
from workflows.yaml_safety import YamlRefused

LOCATED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): \S")

TARGET = """\
name: prod-eu
telemetry: {prometheus: "http://prom.example:9090"}
consul:
  address: http://consul.example:8500
  servers: [http://consul1.example:8500]
  token: {address: "http://vault.example:8200", path: consul/acl, field: token}
nomad:
  address: http://nomad.example:4646
groups:
  consul_servers:
    - {name: consul1, address: 10.0.0.11, key_path: /etc/coldstart/id_ed25519, known_hosts: /etc/coldstart/known_hosts}
services:
  - {name: billing, tier: internal, usage_flag_key: flags/billing}
"""


def _write(tmp_path: Path, text: str, name: str = "prod-eu") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_target_file_reads_as_the_contract(tmp_path: Path) -> None:
    inventory = load_inventory("prod-eu", _write(tmp_path, TARGET).parent)
    assert isinstance(inventory, Inventory) and inventory.consul.token.path == "consul/acl"
    # What runbooks see as `target` is what the file says, nothing added.
    assert inventory.as_target()["nomad"] == {"address": "http://nomad.example:4646"}


def test_inventory_entries_are_valid_action_arguments(tmp_path: Path) -> None:
    """An entry that validates in the inventory passes as the action's argument as it is."""
    target = load_inventory("prod-eu", _write(tmp_path, TARGET).parent).as_target()
    registry = load_registry()

    def model(action: str, field: str):
        return registry.get(action).input_model.model_fields[field].annotation

    from pydantic import TypeAdapter

    TypeAdapter(model("firewall.block", "hosts")).validate_python(target["groups"]["consul_servers"])
    TypeAdapter(model("consul.kv.set", "consul")).validate_python(target["consul"])
    TypeAdapter(model("consul.users.disable", "services")).validate_python(target["services"])


@pytest.mark.parametrize("body, line, needle", [
    (TARGET.replace("    - {name: consul1,", "    - {nmae: consul1,"), 11, "unknown field 'nmae'"),
    (TARGET.replace("path: consul/acl, ", ""), 6, "missing required field 'path'"),
    (TARGET.replace("  address: http://nomad.example:4646", "  address: nomad.example"), 8, "address"),
    (TARGET.replace("tier: internal", "tier: internal, essentail: true"), 13, "unknown field 'essentail'"),
    (TARGET.replace('telemetry: {prometheus: "http://prom.example:9090"}\n', ""), 1, "missing required field 'telemetry'"),
])
def test_contract_breaches_are_located_in_the_target_file(tmp_path: Path, body: str, line: int, needle: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(InventoryInvalid) as caught:
        read_inventory(path)
    errors = caught.value.errors
    assert all((m := LOCATED.match(e)) and m["file"] == str(path) for e in errors), errors
    assert any(int(LOCATED.match(e)["line"]) == line and needle in e for e in errors), errors


def test_hostile_files_are_refused_by_the_guarded_reader(tmp_path: Path) -> None:
    path = _write(tmp_path, "a: &a [*a]\n")
    with pytest.raises(YamlRefused):
        read_inventory(path)
    with pytest.raises(YamlRefused, match="an inventory must be a mapping"):
        read_inventory(_write(tmp_path, "- just\n- a list\n"))


def test_lab_services_validate_as_action_inputs() -> None:
    from activities.consul.services import UserService
    from lab.settings import LabConfig
    from lab.users import user_services

    services = user_services(LabConfig())
    assert [s.name for s in services if not s.essential]
    for service in services:
        action = UserService.model_validate(service.model_dump())
        # The lab's checks belong to the services' Nomad jobs: stretched there, not on an agent.
        assert action.check_owner == "nomad" and action.nomad_job == service.name and action.check_name


AGENTS = TARGET + """\
hosts:
  web1:
    address: 10.0.0.31
    executor: {address: 10.0.0.31, key_path: /etc/coldstart/id_ed25519, known_hosts: /etc/coldstart/known_hosts}
consul_agents:
  - {name: web1, role: client, address: 10.0.0.31, key_path: /etc/coldstart/id_ed25519,
     known_hosts: /etc/coldstart/known_hosts, http: "http://10.0.0.31:8500", config_dir: /etc/consul.d,
     restart: [systemctl, restart, consul]}
"""


def test_consul_agents_are_the_streaming_actions_argument(tmp_path: Path) -> None:
    from pydantic import TypeAdapter

    target = load_inventory("prod-eu", _write(tmp_path, AGENTS).parent).as_target()
    field = load_registry().get("consul.agents.streaming").input_model.model_fields["agents"]
    [agent] = TypeAdapter(field.annotation).validate_python(target["consul_agents"])
    assert (agent.role, agent.config_dir, agent.restart) == ("client", "/etc/consul.d", ["systemctl", "restart", "consul"])


@pytest.mark.parametrize("body, needle", [
    (AGENTS.replace("config_dir: /etc/consul.d", "config_dir: consul.d"), "must be an absolute path"),
    (AGENTS.replace("config_dir: /etc/consul.d", "config_dir: /etc/../consul.d"), "must be an absolute path"),
    (AGENTS.replace("restart: [systemctl, restart, consul]", "restart: []"), "restart"),
    (AGENTS.replace("role: client", "role: leader"), "role"),
    (AGENTS.replace("http: \"http://10.0.0.31:8500\"", "http: 10.0.0.31:8500"), "http"),
    (AGENTS + AGENTS[AGENTS.index("  - {name: web1, role"):], "duplicate consul agent names: ['web1']"),
    (AGENTS.replace("role: client, address: 10.0.0.31", "role: client, address: 10.0.0.32"),
     "consul_agents web1: its shell access differs from hosts.web1.executor"),
])
def test_bad_consul_agents_are_refused(tmp_path: Path, body: str, needle: str) -> None:
    with pytest.raises(InventoryInvalid) as caught:
        read_inventory(_write(tmp_path, body))
    assert any(needle in e for e in caught.value.errors), caught.value.errors


@pytest.mark.parametrize("file", ["../../../etc/cron.d/x.json", "/etc/sudoers.d/x.json", "sub/x.json", "..json",
                                  "x.hcl", ""])
def test_the_streaming_undo_writes_only_a_drop_in_of_the_agents_config_dir(file: str) -> None:
    """The undo's input comes back from a run's history: its file is a name in config_dir, as the change's is."""
    from pydantic import ValidationError

    from activities.contracts.consul_agents import AgentsStreamingRestoreInput

    agent = {"name": "web1", "role": "client", "address": "10.0.0.31", "key_path": "/etc/coldstart/id_ed25519",
             "known_hosts": "/etc/coldstart/known_hosts", "http": "http://10.0.0.31:8500",
             "config_dir": "/etc/consul.d", "restart": ["systemctl", "restart", "consul"]}
    one = {"agent": agent, "previous": None, "written": "{}", "report": {"use_streaming_backend": True}}
    consul = {"address": "http://10.0.0.31:8500"}
    def undo(name: str) -> AgentsStreamingRestoreInput:
        return AgentsStreamingRestoreInput.model_validate({"consul": consul, "agents": [{**one, "file": name}]})

    assert undo("coldstart-streaming.json").agents[0].file == "coldstart-streaming.json"
    with pytest.raises(ValidationError, match="agents.0.file"):
        undo(file)
