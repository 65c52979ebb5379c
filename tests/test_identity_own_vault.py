"""`--vault-login` sends the operator's password or token to their own Vault only: VAULT_ADDR or --vault-addr, and
only when it is the Vault the run's status names. A run's status comes from whoever started it or answers its
queries, so an address it names is never where a login goes in place of the operator's own."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import cli.identity
import cli.main
from cli.identity import DecisionSource, IdentityTokenError, own_vault, same_vault

NAMED = "https://vault.attacker.test:8200"
OWN = "https://vault.example.test:8200"


@pytest.fixture
def seams(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any], dict[str, DecisionSource]]:
    """(the updates sent, the logins made, the run's source to answer with): no Temporal and no Vault involved."""
    sent: list[Any] = []
    logins: list[Any] = []
    run = {"source": DecisionSource(vault=NAMED, provider="coldstart", audience="coldstart-decisions", nonce="n")}
    monkeypatch.setattr(cli.main, "_update", lambda ref, name, body: sent.append((name, body)))
    monkeypatch.setattr(cli.main, "_decision", lambda run_ref, verb, step, vault_login, vault_auth="userpass": (
        run["source"] if vault_login else None, step))

    def fetch(address: str, *args: Any, **login: Any) -> str:
        logins.append((address, login.get("username"), login.get("password")))
        return "e30.e30.c2ln"

    monkeypatch.setattr(cli.identity, "fetch_decision_token", fetch)
    monkeypatch.setenv("VAULT_PASSWORD", "bobs-password")
    monkeypatch.delenv("VAULT_ADDR", raising=False)
    return sent, logins, run


def _refused(args: list[str], env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(cli.main.app, args, env=env)
    assert getattr(result.exception, "code", None) == 2, (result.output, result.exception)  # invalid input
    message = str(result.exception)
    assert "\n" not in message
    return message


def test_a_login_never_goes_to_the_vault_a_run_names_in_place_of_the_operators_own(seams) -> None:
    sent, logins, _ = seams
    message = _refused(["approve", "prod", "go", "--as", "bob", "--vault-login"])
    assert message == ("--vault-login: no Vault of your own configured: set VAULT_ADDR (or pass --vault-addr) to your "
                       f"Vault; this run's tokens come from {NAMED}")
    message = _refused(["abort", "prod", "--as", "bob", "--vault-login"], env={"VAULT_ADDR": OWN})
    assert message == (f"--vault-login: your Vault is {OWN} (VAULT_ADDR or --vault-addr) and this run's tokens come "
                       f"from {NAMED}: your login goes to your own Vault only")
    assert OWN in _refused(["retry", "prod", "held", "--as", "bob", "--vault-login", "--vault-addr", OWN])
    assert NAMED in _refused(["identity", "token", "prod", "--verb", "pause", "--as", "bob", "--vault-addr", OWN])
    assert logins == [] and sent == []


def test_a_login_goes_to_the_operators_own_vault_when_the_run_names_it(seams) -> None:
    sent, logins, run = seams
    run["source"] = DecisionSource(vault="https://VAULT.example.test:8200/", provider="coldstart",
                                   audience="coldstart-decisions", nonce="n")
    result = CliRunner().invoke(cli.main.app, ["approve", "prod", "go", "--as", "bob", "--vault-login"],
                                env={"VAULT_ADDR": OWN})
    assert result.exit_code == 0, (result.output, result.exception)
    assert logins == [(OWN, "bob", "bobs-password")]
    assert [(name, body.approver, body.identity_token) for name, body in sent] == [("approve", "bob", "e30.e30.c2ln")]


def test_same_vault_and_own_vault() -> None:
    assert same_vault("https://Vault.example.test", "https://vault.example.test:443/")
    assert same_vault("http://127.0.0.1:8200", "http://127.0.0.1:8200/")
    assert not same_vault("http://vault.example.test:8200", "https://vault.example.test:8200")
    assert not same_vault("https://vault.example.test:8200", "https://vault.example.test.attacker.test:8200")
    assert not same_vault("https://vault.example.test:8200", "https://vault.example.test:8201")
    assert own_vault(f" {OWN} ", OWN) == OWN
    for configured in (None, "", " "):
        with pytest.raises(IdentityTokenError, match="set VAULT_ADDR"):
            own_vault(configured, OWN)
