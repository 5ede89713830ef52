"""deploy/compose.yaml: `docker compose config` where a compose is installed, else a lint that checks the
same stack against the code — every command parses with the real CLI, every setting exists."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from apps.cli import build_parser
from veritrain.settings import Settings, load_settings

ROOT = Path(__file__).parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
EXAMPLE_ENV = ROOT / "deploy" / "example.env"
EXPECTED = {"postgres", "redis", "chain", "deploy", "market", "worker", "provider", "verifier"}
VARIABLE = re.compile(r"\$\{(\w+)(?::?[-?][^}]*)?\}")


def example_env() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in EXAMPLE_ENV.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.startswith("#")}


def substitute(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?message} with the example env (every one must be there)."""
    if isinstance(value, str):
        return VARIABLE.sub(lambda m: env[m.group(1)] if m.group(1) in env else _default(m), value)
    if isinstance(value, list):
        return [substitute(v, env) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, env) for k, v in value.items()}
    return value


def _default(match: re.Match[str]) -> str:
    text = match.group(0)
    if ":-" in text:
        return text.split(":-", 1)[1].rstrip("}")
    raise AssertionError(f"{match.group(1)} is used in compose.yaml but missing from deploy/example.env")


@pytest.fixture(scope="module")
def stack() -> dict[str, Any]:
    return dict(substitute(yaml.safe_load(COMPOSE.read_text()), example_env()))


def test_docker_compose_config_accepts_it_where_available() -> None:
    docker = shutil.which("docker")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True) if docker else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no docker compose here; test_the_stack_matches_the_code lints the file instead")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "--env-file", str(EXAMPLE_ENV), "config", "-q"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_the_stack_matches_the_code(stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    services: dict[str, Any] = stack["services"]
    assert set(services) == EXPECTED
    subnet = ipaddress.ip_network(stack["networks"]["veritrain"]["ipam"]["config"][0]["subnet"])
    addresses: dict[str, str] = {}
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        fixed = (service.get("networks") or {}) if isinstance(service.get("networks"), dict) else {}
        for network in fixed.values():
            if network and "ipv4_address" in network:
                assert ipaddress.ip_address(network["ipv4_address"]) in subnet, name
                addresses[name] = network["ipv4_address"]
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./") and not source.startswith("./keys/"):
                assert (COMPOSE.parent / source).exists(), f"{name} mounts missing {source}"
    assert len(set(addresses.values())) == len(addresses), "two services share an address"

    fields = set(Settings.model_fields)
    for name, service in services.items():
        if service.get("image") != "veritrain:local":
            continue
        assert service["build"]["dockerfile"] == "deploy/Dockerfile" and (ROOT / "deploy/Dockerfile").exists()
        for key in service.get("environment") or {}:
            assert key.removeprefix("VERITRAIN_").lower() in fields or key == "VERITRAIN_KEYSTORE_PASSWORD", (
                key
            )
        if service.get("entrypoint"):
            continue  # the chain node: hardhat, not the veritrain CLI
        argv = [str(word) for word in service["command"]]
        args = build_parser(argv).parse_args(argv)  # SystemExit on an unknown command or flag
        if getattr(args, "p2p_host", None):
            assert args.p2p_host == addresses[name], f"{name} must advertise its own fixed address"

    # the shared configuration file holds only known settings, pointing at the services' addresses
    monkeypatch.setenv("VERITRAIN_CONFIG", str(COMPOSE.parent / "veritrain.toml"))
    settings = load_settings()
    assert settings.market_url == f"http://{addresses['market']}:8700"
    assert settings.chain_rpc_url == f"http://{addresses['chain']}:8545"
