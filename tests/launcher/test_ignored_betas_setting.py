"""The operator's list of `anthropic-beta` names the Messages API takes without doing what they
ask (`spec.controller.http.anthropicBetasIgnored`, `spec.router.http.anthropicBetasIgnored`, the
controller's `INTENTSERVE_HTTP_ANTHROPIC_BETAS_IGNORED`): none by default, what travels to the
servers' configs, a bad name refused naming its field; and the door taking a listed beta, saying
so in the reply's header, while every other unknown beta is still refused."""

from __future__ import annotations

import anthropic
import pytest
from intentserve.controller.auth import Security
from intentserve.controller.launch.manifest import ManifestError, parse_manifest
from intentserve.controller.launch.router_spec import router_config
from intentserve.controller.router.http.anthropic_betas import IGNORED_HEADER
from intentserve.controller.router.http.app import Frontend, build_app
from intentserve.controller.settings import ControllerSettings
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from tests.controller import test_anthropic_messages as door

HEADER = {"apiVersion": "intentserve/v1", "kind": "Deployment", "metadata": {"name": "t"}}
CLAUDE_CODE = "claude-code-20250219"


def manifest(spec: dict):
    return parse_manifest({**HEADER, "spec": spec})


def test_none_is_ignored_by_default():
    m = manifest({})
    assert m.controller_config().http_limits.anthropic_betas_ignored == ()
    assert router_config(m, "c:1", Security()).http_limits.anthropic_betas_ignored == ()
    assert ControllerSettings(insecure=True).config().http_limits.anthropic_betas_ignored == ()


def test_the_field_travels_to_the_controller_and_to_a_router():
    m = manifest(
        {
            "controller": {"http": {"anthropicBetasIgnored": [CLAUDE_CODE]}},
            "router": {"http": {"anthropicBetasIgnored": ["x-1"]}},
        }
    )
    assert m.controller_config().http_limits.anthropic_betas_ignored == (CLAUDE_CODE,)
    assert router_config(m, "c:1", Security()).http_limits.anthropic_betas_ignored == ("x-1",)


def test_the_controllers_environment_sets_it(monkeypatch):
    monkeypatch.setenv("INTENTSERVE_HTTP_ANTHROPIC_BETAS_IGNORED", f'["{CLAUDE_CODE}"]')
    limits = ControllerSettings(insecure=True).config().http_limits
    assert limits.anthropic_betas_ignored == (CLAUDE_CODE,)


@pytest.mark.parametrize(
    ("name", "says"),
    [("Claude Code", "is not a beta name"), ("tools-2024-04-04", "is served here")],
)
def test_a_bad_name_is_refused_naming_the_field(name, says):
    with pytest.raises(ManifestError) as caught:
        manifest({"controller": {"http": {"anthropicBetasIgnored": [name]}}})
    (found,) = caught.value.problems
    assert found.startswith("spec.controller.http.anthropicBetasIgnored: ") and says in found


@pytest.fixture
def http():
    router = door.Router()
    security = Security(api_keys=frozenset({door.KEY}))
    frontend = Frontend(
        router,
        None,
        security,
        (door.MODEL,),
        CollectorRegistry(),
        door.Tokenizing(),
        anthropic_betas_ignored=(CLAUDE_CODE,),
    )
    with TestClient(build_app(frontend), raise_server_exceptions=False) as client:
        yield client


def test_a_listed_beta_is_taken_and_said_back_and_others_still_refused(http):
    body = {"model": door.MODEL, "max_tokens": 16, "messages": door.HI}
    headers = {"x-api-key": door.KEY, "anthropic-beta": f"{CLAUDE_CODE},effort-2025-11-24"}
    for stream in (False, True):
        sent = http.post("/v1/messages", json={**body, "stream": stream}, headers=headers)
        assert sent.status_code == 200 and sent.headers[IGNORED_HEADER] == CLAUDE_CODE
    count = {"model": door.MODEL, "messages": door.HI}
    counted = http.post("/v1/messages/count_tokens", json=count, headers=headers)
    assert counted.status_code == 200 and counted.headers[IGNORED_HEADER] == CLAUDE_CODE
    plain = http.post("/v1/messages", json=body, headers={"x-api-key": door.KEY})
    assert plain.status_code == 200 and IGNORED_HEADER not in plain.headers
    other = {"x-api-key": door.KEY, "anthropic-beta": f"{CLAUDE_CODE},mcp-client-2025-04-04"}
    refused = http.post("/v1/messages", json=body, headers=other)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith("anthropic-beta: 'mcp-client-2025-04-04'")
    client = anthropic.Anthropic(
        api_key=door.KEY, base_url="http://testserver", http_client=http, max_retries=0
    )
    reply = client.beta.messages.with_raw_response.create(
        model=door.MODEL, max_tokens=16, messages=door.HI, betas=[CLAUDE_CODE]
    )
    assert reply.headers[IGNORED_HEADER] == CLAUDE_CODE
