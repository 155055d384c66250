"""Which event loop the controller's and a router's gRPC servers run on: uvloop where it
imports, asyncio's otherwise, INTENTSERVE_EVENT_LOOP to choose; and where that shows."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
import uvloop
from intentserve.controller.aio_loop import EventLoopThread
from intentserve.controller.event_loop import (
    EVENT_LOOP_ENV,
    LoopKind,
    choose_event_loop,
)
from intentserve.controller.router.server import RouterServer
from intentserve.controller.router.settings import RouterConfig
from intentserve.policy import IntentError

from tests.controller.conftest import DEPLOYMENT


@pytest.mark.parametrize(
    ("environ", "kind", "why"),
    [
        ({}, LoopKind.UVLOOP, f"uvloop ({EVENT_LOOP_ENV}=auto)"),
        ({EVENT_LOOP_ENV: " "}, LoopKind.UVLOOP, f"uvloop ({EVENT_LOOP_ENV}=auto)"),
        ({EVENT_LOOP_ENV: "auto"}, LoopKind.UVLOOP, f"uvloop ({EVENT_LOOP_ENV}=auto)"),
        ({EVENT_LOOP_ENV: "UVLOOP"}, LoopKind.UVLOOP, f"uvloop ({EVENT_LOOP_ENV}=uvloop)"),
        ({EVENT_LOOP_ENV: "asyncio"}, LoopKind.ASYNCIO, f"asyncio ({EVENT_LOOP_ENV}=asyncio)"),
    ],
)
def test_the_loop_chosen_where_uvloop_imports(environ, kind, why):
    choice = choose_event_loop(environ)
    assert (choice.kind, choice.why) == (kind, why)


def test_an_unknown_word_is_refused_naming_the_variable_and_the_allowed_values():
    with pytest.raises(IntentError) as error:
        choose_event_loop({EVENT_LOOP_ENV: "trio"})
    assert error.value.field == EVENT_LOOP_ENV
    assert str(error.value) == (
        f"{EVENT_LOOP_ENV}: invalid value 'trio'; allowed values are auto, uvloop, asyncio"
    )


def test_without_uvloop_auto_says_why_it_is_asyncio_and_an_explicit_uvloop_is_refused(
    monkeypatch,
):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # its import fails, as where it is absent
    choice = choose_event_loop({})
    assert choice.kind is LoopKind.ASYNCIO
    assert choice.why.startswith(f"asyncio ({EVENT_LOOP_ENV}=auto; uvloop does not import: ")
    with pytest.raises(IntentError) as error:
        choose_event_loop({EVENT_LOOP_ENV: "uvloop"})
    assert error.value.field == EVENT_LOOP_ENV
    assert "uvloop was asked for, but it does not import" in str(error.value)


@pytest.mark.parametrize(
    ("word", "loop_type"), [("uvloop", uvloop.Loop), ("asyncio", asyncio.BaseEventLoop)]
)
def test_the_loop_thread_runs_the_chosen_loop(word, loop_type, caplog):
    caplog.set_level(logging.INFO, logger="intentserve.controller.aio_loop")
    loop = EventLoopThread("test-loop", choose_event_loop({EVENT_LOOP_ENV: word}))
    try:

        async def running():
            return asyncio.get_running_loop()

        assert isinstance(loop.run(running()), loop_type)
    finally:
        loop.close()
    assert f"test-loop runs on {word} ({EVENT_LOOP_ENV}={word})" in caplog.text


@pytest.mark.integration
@pytest.mark.parametrize("word", ["uvloop", "asyncio"])
def test_a_routers_metrics_say_which_loop_it_runs_on(word, monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, word)
    config = RouterConfig(DEPLOYMENT, controller="nowhere:1", port=0)
    with RouterServer(config, watch=False) as router:
        assert router.metrics.get_sample_value("intentserve_event_loop_info", {"loop": word}) == 1


@pytest.mark.integration
def test_a_controller_runs_on_uvloop_by_default_and_its_metrics_say_so(
    monkeypatch, start_controller
):
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    server, _ = start_controller()
    assert server.metrics.get_sample_value("intentserve_event_loop_info", {"loop": "uvloop"}) == 1


@pytest.mark.integration
def test_a_controller_refuses_an_unknown_loop_before_it_starts(monkeypatch, start_controller):
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(IntentError, match=EVENT_LOOP_ENV):
        start_controller()
