"""docker-compose.yml and the Dockerfile say only what Tendon accepts: no servers, no Docker.

These tests read the files and hold them to the code: every ``TENDON_*`` name is a setting
(``infra.process.settings.Settings``) and its value validates, every Brain or Hands command parses
with the real ``brain``/``hands`` parser, a service waits for the services it names, restarts, and
is healthy only while ready; only the API is published, on the loopback, at a port a user sets;
the services' data is kept in named volumes; logs rotate; the image is built once and is the
package. tests/test_compose_live.py runs the file on a Docker engine (TENDON_TEST_COMPOSE=1).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from setuptools import find_packages

from brain.face.cli import _parser as brain_parser
from hands.cli import build_parser as hands_parser
from infra.process.settings import Settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
HOST_PORTS: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.host.yml").read_text())
# Where the images of the services that keep data keep it.
DATA = {"postgres": "/var/lib/postgresql/data", "rabbitmq": "/var/lib/rabbitmq", "minio": "/data"}
# The host's own services hold these: a default that takes one of them fails `up` there.
TAKEN = {"5432", "5672", "8080"}
# A published port: [HOST_IP:]HOST_PORT:CONTAINER_PORT, the host port ${VARIABLE:-default}.
PORT = re.compile(r"(?P<ip>[\d.]+):\$\{(?P<variable>\w+):-(?P<default>\d+)\}:(?P<target>\d+)")
PARSERS = {"brain": brain_parser, "hands": hands_parser}
RESTART_POLICIES = {"always", "unless-stopped", "on-failure"}
# A host as a URL or a HOST:PORT names it: postgres:5432, http://minio:9000, amqp://u:p@rabbitmq:5672/
HOST = re.compile(r"(?:^|://|@)([A-Za-z0-9][\w.-]*)(?=:\d|/|$)")
# Compose fills ${NAME:-default} from the shell; the test takes the default.
INTERPOLATION = re.compile(r"\$\{\w+:?-([^}]*)\}")


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment, given as a mapping (merge keys resolved) or as NAME=VALUE lines."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(line.partition("=")[::2] for line in env)
    return {name: INTERPOLATION.sub(r"\1", str(value or "")) for name, value in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    found = service.get("command") or []
    return shlex.split(found) if isinstance(found, str) else [str(arg) for arg in found]


def tendon_process(name: str) -> str | None:
    """``brain`` or ``hands`` when the service runs that command, else None."""
    argv = command(SERVICES[name])
    return argv[0] if argv and argv[0] in PARSERS else None


def parsed(name: str) -> argparse.Namespace:
    """The service's command as its real parser reads it, without running anything."""
    process, *args = command(SERVICES[name])
    try:
        return PARSERS[process]().parse_args(args)
    except SystemExit:
        pytest.fail(f"{name}: `{shlex.join([process, *args])}` does not parse (usage above)")


def tools_modules(name: str) -> list[str]:
    if tendon_process(name) is None:
        return []
    tools = getattr(parsed(name), "tools", None) or []
    return [tools] if isinstance(tools, str) else list(tools)


def setting_names() -> set[str]:
    """The environment name of every field, as pydantic-settings maps them (prefix + name)."""
    prefix = Settings.model_config.get("env_prefix", "")
    return {(prefix + field).upper() for field in Settings.model_fields}


TENDON = sorted(name for name in SERVICES if tendon_process(name))


def test_the_file_runs_a_brain_and_a_hands_service() -> None:
    assert {tendon_process(name) for name in TENDON} == {"brain", "hands"}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_tendon_variable_is_a_setting_and_its_value_validates(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {key: value for key, value in environment(SERVICES[name]).items() if key.startswith("TENDON_")}
    # A tools module may read a variable of its own (examples.email_tools: TENDON_MAILBOX_URL).
    tools_source = "".join(inspect.getsource(importlib.import_module(m)) for m in tools_modules(name))
    unknown = [
        key
        for key in sorted(env)
        if key not in setting_names() and not re.search(rf"\b{key}\b", tools_source)
    ]
    assert not unknown, f"{name}: not a field of infra.process.settings.Settings: {unknown}"
    for key in [key for key in os.environ if key.startswith("TENDON_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    Settings()  # raises on a value the process would refuse at start


def test_the_image_sets_only_known_variables() -> None:
    lines = (REPO / "Dockerfile").read_text().splitlines()
    used = {m for line in lines if not line.lstrip().startswith("#") for m in re.findall(r"TENDON_\w+", line)}
    assert used <= setting_names(), f"Dockerfile: not settings: {sorted(used - setting_names())}"


@pytest.mark.parametrize("name", TENDON)
def test_brain_and_hands_commands_parse_and_their_tools_import(name: str) -> None:
    parsed(name)
    for module in tools_modules(name):
        if module.endswith(".py"):
            assert (REPO / module).is_file(), f"{name}: --tools {module}: no such file"
        else:
            importlib.import_module(module)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_a_service_waits_for_every_service_it_names(name: str) -> None:
    service = SERVICES[name]
    strings = [*environment(service).values(), *command(service)]
    named = {host for s in strings for host in HOST.findall(s) if host in SERVICES and host != name}
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        depends = {other: {"condition": "service_started"} for other in depends}
    missing = sorted(named - set(depends))
    assert not missing, f"{name} names {missing} but does not list them in depends_on"
    for other in sorted(depends):
        # Healthy when it can tell (Compose refuses service_healthy on a service without a check).
        healthy = depends[other].get("condition") == "service_healthy"
        checked = bool(SERVICES.get(other, {}).get("healthcheck"))
        assert healthy == checked, f"{name} waits for {other} {'healthy' if healthy else 'started'}"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_restarts(name: str) -> None:
    policy = str(SERVICES[name].get("restart", "")).split(":")[0]
    assert policy in RESTART_POLICIES, f"{name}: restart is {policy or 'missing'}"


@pytest.mark.parametrize("name", TENDON)
def test_brain_and_hands_are_healthy_only_once_ready(name: str) -> None:
    ready = environment(SERVICES[name]).get("TENDON_READY_FILE")
    assert ready, f"{name}: no TENDON_READY_FILE, so nothing tells ready from running"
    check = (SERVICES[name].get("healthcheck") or {}).get("test", [])
    assert ready in (shlex.split(check) if isinstance(check, str) else check), f"{name}: healthcheck {check}"


def test_the_image_runs_as_a_user_and_holds_the_whole_package() -> None:
    instructions = [line.split(None, 1) for line in (REPO / "Dockerfile").read_text().splitlines()]
    instructions = [i for i in instructions if len(i) == 2 and not i[0].startswith("#")]
    users = [arg.strip() for word, arg in instructions if word.upper() == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"the image runs as {users or 'root'}"

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    needed = {p.split(".")[0] for p in find_packages(str(REPO), include=include)}
    needed.add(project["project"]["readme"])
    copied = {
        src.rstrip("/")
        for word, arg in instructions
        if word.upper() == "COPY"
        for src in arg.split()[:-1]
        if not src.startswith("--")
    }
    assert "." in copied or needed <= copied, f"the Dockerfile does not copy {sorted(needed - copied)}"
    ignored = [p.strip().rstrip("/") for p in (REPO / ".dockerignore").read_text().splitlines()]
    assert not needed & set(ignored), f".dockerignore leaves out {sorted(needed & set(ignored))}"


def published(service: dict[str, Any]) -> list[re.Match[str]]:
    """Each port a service publishes, read as ``PORT`` (a mismatch fails the test)."""
    found = []
    for entry in service.get("ports") or []:
        match = PORT.fullmatch(str(entry))
        assert match, f"{entry!r}: not 127.0.0.1:${{TENDON_..._PORT:-default}}:port"
        found.append(match)
    return found


def test_only_the_api_is_published_on_the_loopback_at_a_port_a_user_sets_that_the_host_leaves_free() -> None:
    publishing = {name for name, service in SERVICES.items() if service.get("ports")}
    assert publishing == {"brain"}, f"published: {sorted(publishing)}; the services reach each other inside"
    (api,) = published(SERVICES["brain"])
    assert api["ip"] == "127.0.0.1" and api["variable"] == "TENDON_HTTP_PORT"
    assert api["default"] not in TAKEN, "a development server holds 8080, PostgreSQL and RabbitMQ theirs"
    assert environment(SERVICES["brain"])["TENDON_HTTP"].endswith(":" + api["target"])


def test_the_host_file_publishes_the_services_on_the_loopback_at_ports_a_user_sets() -> None:
    for name, service in HOST_PORTS["services"].items():
        assert name in SERVICES
        for port in published(service):
            assert port["ip"] == "127.0.0.1" and port["variable"].startswith("TENDON_"), port.group(0)


@pytest.mark.parametrize("name", sorted(DATA))
def test_the_services_keep_their_data_in_named_volumes(name: str) -> None:
    mounts = dict(str(v).split(":")[1::-1] for v in SERVICES[name].get("volumes") or [])
    volume = mounts.get(DATA[name])
    assert volume, f"{name} keeps {DATA[name]} in an anonymous volume: `down` loses it"
    assert volume in (COMPOSE.get("volumes") or {}), f"{name}: {volume} is not a named volume"


def test_the_mailbox_keeps_its_state_in_a_named_volume() -> None:
    state = command(SERVICES["mailbox"])[command(SERVICES["mailbox"]).index("--state") + 1]
    mounts = [str(v).split(":") for v in SERVICES["mailbox"].get("volumes") or []]
    assert any(state.startswith(path + "/") and volume in COMPOSE["volumes"] for volume, path in mounts), (
        mounts
    )


def test_rabbitmq_keeps_its_node_name_when_its_container_is_re_created() -> None:
    assert SERVICES["rabbitmq"].get("hostname"), "a new container id would be a new node, its queues gone"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_rotates_its_log(name: str) -> None:
    logging = SERVICES[name].get("logging") or {}
    options = logging.get("options") or {}
    assert logging.get("driver") == "json-file" and options.get("max-size") and options.get("max-file")


def test_the_image_is_built_once_and_every_service_of_it_runs_that_one() -> None:
    builds = [name for name, service in SERVICES.items() if service.get("build")]
    assert len(builds) == 1, f"built by {builds}: each builds it anew"
    image = SERVICES[builds[0]].get("image")
    assert image, "an image name, for the services that run it"
    ours = [
        name for name in SERVICES if tendon_process(name) or "examples.mailbox" in command(SERVICES[name])
    ]
    assert {SERVICES[name].get("image") for name in ours} == {image}


@pytest.mark.parametrize("name", TENDON)
def test_the_ready_file_is_on_a_tmpfs_of_the_images_user_so_a_restarted_container_starts_without_one(
    name: str,
) -> None:
    ready = environment(SERVICES[name])["TENDON_READY_FILE"]
    tmpfs = [str(entry).partition(":") for entry in SERVICES[name].get("tmpfs") or []]
    (options,) = [opts for path, _, opts in tmpfs if ready.startswith(path.rstrip("/") + "/")]
    # Docker 20.10 makes a restarted container's tmpfs root's (mode 755) unless it names an owner.
    uid = re.search(r"useradd[^\n]*--uid (\d+)", (REPO / "Dockerfile").read_text())
    assert uid and f"uid={uid.group(1)}" in options.split(","), options


def test_the_cli_in_the_brain_container_goes_through_its_api_and_so_asks_for_a_token() -> None:
    env = environment(SERVICES["brain"])
    assert env["TENDON_URL"].endswith(":" + env["TENDON_HTTP"].rpartition(":")[2])


def test_brain_demo_can_keep_its_data_in_the_image() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"chown [^\n]*/app/\.tendon", text), "/app is read-only to the image's user"


def mcp_servers(name: str) -> list[Any]:
    """The MCP servers a Hands service serves (its --mcp specs, as the pool reads them)."""
    from hands.tools.mcp_config import server_specs

    if tendon_process(name) != "hands":
        return []
    args = parsed(name)
    return server_specs(list(args.mcp), None) if args.mcp else []


def test_the_file_runs_a_pool_of_an_mcp_server_whose_module_is_in_the_image() -> None:
    served = {name: mcp_servers(name) for name in TENDON if mcp_servers(name)}
    assert served, "no Hands service serves an MCP server"
    for name, servers in served.items():
        for spec in servers:
            assert spec.command, f"{name}: {spec.where} (a URL) is another service's, not the image's"
            program, *args = spec.command
            assert program == "python" and args[:1] == ["-m"], (
                f"{name}: {spec.where} is not `python -m MODULE`"
            )
            importlib.import_module(args[1])  # in the package the image holds
            # What the server keeps lives in a volume, not in the container's layer.
            paths = [a for a in args if a.startswith("/")]
            mounts = [str(v).split(":")[1] for v in SERVICES[name].get("volumes") or []]
            assert all(any(p.startswith(m.rstrip("/") + "/") for m in mounts) for p in paths), (name, paths)


def test_the_image_carries_the_mcp_extra_its_pools_need() -> None:
    text = (REPO / "Dockerfile").read_text()
    default = re.search(r"^ARG EXTRAS=(\S*)", text, re.MULTILINE)
    assert default and "mcp" in default.group(1).split(","), "the image is built without the mcp extra"
    assert re.search(r'pip install [^\n]*"\.\$\{EXTRAS:\+\[\$EXTRAS\]\}"', text), "EXTRAS is not installed"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "mcp" in extras
