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


def test_lab_services_validate_as_action_inputs():
    from lab.settings import LabConfig
    from lab.users import user_services

    services = user_services(LabConfig())
    assert [s.name for s in services if not s.essential]
    for service in services:
        ActionUserService.model_validate(service.model_dump())
