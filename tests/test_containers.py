"""The container image and the Kubernetes manifests (no engine runs here: the manifests
are validated against the Kubernetes schema offline, the Dockerfile is parsed and
checked against the repository)."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (the test extra has it)"
)
dockerfile_parse = pytest.importorskip(
    "dockerfile_parse", reason="dockerfile-parse is not installed (the test extra has it)"
)

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
PORTS = [5555, 5556, 5557]


def documents() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def by_kind(kind: str, name: str) -> dict:
    (doc,) = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name)
def test_manifests_validate_against_the_kubernetes_schema(path):
    for doc in yaml.safe_load_all(path.read_text()):
        version = kubernetes_validate.latest_version()
        # strict: an unknown or misspelt field is an error, not ignored
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_misspelt_field_fails_validation():
    doc = by_kind("Deployment", "zmq-rl-actor")
    doc["spec"]["replica"] = doc["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def container(deployment: dict) -> dict:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def test_the_service_exposes_the_learners_three_ports_under_their_own_numbers():
    service = by_kind("Service", "zmq-rl-learner")
    learner = by_kind("Deployment", "zmq-rl-learner")
    assert [p["port"] for p in service["spec"]["ports"]] == PORTS
    named = {p["name"]: p["containerPort"] for p in container(learner)["ports"]}
    assert [named[p["targetPort"]] for p in service["spec"]["ports"]] == PORTS
    labels = learner["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert learner["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert learner["spec"]["replicas"] == 1 and learner["spec"]["strategy"]["type"] == "Recreate"
    script = container(learner)["args"][0]
    assert "--port 5555" in script and "--host 0.0.0.0" in script
    assert "zmq-learner --resume" in script  # a restarted pod resumes its run


def test_actors_reach_the_service_and_their_replicas_are_the_learners_actors():
    actors = by_kind("Deployment", "zmq-rl-actor")
    cmd = container(actors)["command"]
    assert cmd[0] == "zmq-actor"
    assert cmd[cmd.index("--learner") + 1] == "zmq-rl-learner:5555"
    script = container(by_kind("Deployment", "zmq-rl-learner"))["args"][0]
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    assert int(words[words.index("--num-actors") + 1]) == actors["spec"]["replicas"]


def test_keys_come_from_the_secret_with_private_modes_and_probes_and_requests_are_set():
    secret = by_kind("Secret", "zmq-rl-curve")
    learner = by_kind("Deployment", "zmq-rl-learner")
    actors = by_kind("Deployment", "zmq-rl-actor")
    for deployment in (learner, actors):
        spec = deployment["spec"]["template"]["spec"]
        (keys,) = [v for v in spec["volumes"] if v["name"] == "keys"]
        assert keys["secret"]["secretName"] == "zmq-rl-curve"
        assert keys["secret"]["defaultMode"] & 0o007 == 0  # nothing for others
        assert {i["key"] for i in keys["secret"]["items"]} <= set(secret["stringData"])
        assert spec["securityContext"]["runAsUser"] != 0
        assert container(deployment)["resources"]["requests"]["cpu"]
        mounted = {i["path"] for i in keys["secret"]["items"]}
        args = " ".join(container(deployment).get("args", []) + container(deployment)["command"])
        for path in mounted:
            if path.endswith("key_secret") or path == "learner.key":
                assert f"/keys/{path}" in args
    assert "/keys/authorized" in container(learner)["args"][0]
    probe = container(learner)["livenessProbe"]
    assert probe["tcpSocket"]["port"] == "control"


def test_the_dockerfile_installs_the_package_and_runs_its_console_scripts():
    parser = dockerfile_parse.DockerfileParser(path=str(ROOT / "Dockerfile"))
    instructions = [
        (i["instruction"], i["value"]) for i in parser.structure if i["instruction"] != "COMMENT"
    ]
    kinds = [k for k, _ in instructions]
    assert kinds[0] in ("ARG", "FROM") and "FROM" in kinds
    assert parser.baseimage.startswith("python:3.11")  # ${BASE}'s default, >= python_requires
    for kind, value in instructions:
        if kind == "COPY":
            *sources, _ = value.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert kind != "ADD", "ADD fetches URLs and unpacks archives: use COPY"
    runs = " ".join(v for k, v in instructions if k == "RUN")
    assert "torch==${TORCH_VERSION}" in runs and "--index-url" in runs
    assert "pip install '.[learner]'" in runs
    assert parser.args["TORCH_VERSION"] == "2.13.0"
    users = [v for k, v in instructions if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    exposed = sorted(int(p) for k, v in instructions if k == "EXPOSE" for p in v.split())
    assert exposed == PORTS
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    scripts = [
        line.split("=")[0].strip()
        for line in setup["options.entry_points"]["console_scripts"].strip().splitlines()
    ]
    assert scripts == ["zmq-learner", "zmq-actor", "zmq-rl"]
    # the manifests start scripts that the image installs, from the image it builds
    for name, image in (("zmq-rl-learner", "zmq-rl:"), ("zmq-rl-actor", "zmq-rl-actor:")):
        c = container(by_kind("Deployment", name))
        assert c["image"].startswith(image)
        started = c["command"][0] if c["command"][0] != "/bin/sh" else "zmq-learner"
        assert started in scripts
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "runs" in ignored and ".git" in ignored


def test_the_actor_dockerfile_installs_zmq_rl_without_torch():
    """Dockerfile.actor (issue 46): the actor host's install, ``pip install .`` with no
    extras, checked for the absence of torch; the same base, sources, user and scripts
    as the learner's image, and no port."""
    with open(ROOT / "Dockerfile.actor", "rb") as file:
        parser = dockerfile_parse.DockerfileParser(fileobj=file)
        instructions = [
            (i["instruction"], i["value"])
            for i in parser.structure
            if i["instruction"] != "COMMENT"
        ]
        base = parser.baseimage
    assert base.startswith("python:3.11")
    for kind, value in instructions:
        if kind == "COPY":
            *sources, _ = value.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert kind not in ("ADD", "EXPOSE"), kind
    runs = " ".join(v for k, v in instructions if k == "RUN")
    assert "pip install . ${EXTRA_PACKAGES}" in runs and "find_spec('torch') is not None" in runs
    assert "torch" not in runs.replace("find_spec('torch')", "")
    assert "[" not in runs.split("pip install", 1)[1].split("&&")[0]  # no extra of zmq_rl
    users = [v for k, v in instructions if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    (cmd,) = [v for k, v in instructions if k == "CMD"]
    assert cmd.startswith('["zmq-actor"')
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    required = setup["options"]["install_requires"]
    assert "torch" not in required and "torch" in setup["options.extras_require"]["learner"]
