"""The inventory schema (lab/inventory.py) and the actions' input models must agree field by field."""

from __future__ import annotations

import pytest

from activities.consul import UserService as ActionUserService
from activities.executors import HostTarget as ActionHostTarget
from lab.inventory import HostTarget, UserService


@pytest.mark.parametrize("inventory_model, action_model", [(UserService, ActionUserService),
                                                           (HostTarget, ActionHostTarget)])
def test_inventory_entries_are_valid_action_inputs(inventory_model, action_model):
    # The inventory's fields exist on the action with the same defaults: an entry passes as it is.
    assert set(inventory_model.model_fields) <= set(action_model.model_fields)
    for name, field in inventory_model.model_fields.items():
        assert field.default == action_model.model_fields[name].default, name


def test_user_service_fields_are_the_same_on_both_sides():
    # Every field the action knows can be written in an inventory (check_owner and its fields included).
    assert list(UserService.model_fields) == list(ActionUserService.model_fields)


def test_lab_services_validate_as_action_inputs():
    from lab.settings import LabConfig
    from lab.users import user_services

    services = user_services(LabConfig())
    assert [s.name for s in services if not s.essential]
    for service in services:
        action = ActionUserService.model_validate(service.model_dump())
        # The lab's checks belong to the services' Nomad jobs: stretched there, not on an agent.
        assert action.check_owner == "nomad" and action.nomad_job == service.name and action.check_name
