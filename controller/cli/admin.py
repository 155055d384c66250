"""The admin commands against a running controller (`--controller HOST:PORT`): status, workers,
explain, drain, resume, down, and generate. Tables for people, `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import grpc
from intentserve.client import (
    DEFAULT_CONTROLLER,
    ControllerClient,
    RequestValueError,
    credentials,
)
from intentserve.controller.cli.render import generate_footer, status_text, workers_text

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
CONTROLLER_ENV = "INTENTSERVE_CONTROLLER"
_BAD_INPUT = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=False))


def _status(client: ControllerClient, args: argparse.Namespace) -> int:
    status = client.status()
    _print_json(status) if args.json else print(status_text(status))
    return EXIT_OK


def _workers(client: ControllerClient, args: argparse.Namespace) -> int:
    workers = client.status()["workers"]
    _print_json(workers) if args.json else print(workers_text(workers))
    return EXIT_OK


def _explain(client: ControllerClient, args: argparse.Namespace) -> int:
    explained = client.explain(args.worker)
    _print_json(explained) if args.json else print("\n".join(explained["lines"]))
    return EXIT_OK


def _drain(client: ControllerClient, args: argparse.Namespace) -> int:
    try:
        drained = client.drain(args.worker, force=args.force)
    except grpc.RpcError as error:
        if error.code() is not grpc.StatusCode.FAILED_PRECONDITION:
            raise
        # Refused: it would take the deployment below min_ready.
        print(f"error: {error.code().name}: {error.details()}", file=sys.stderr)
        print("use --force to drain it anyway", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        _print_json(drained)
    else:
        print(f"{args.worker}: {drained['state']}, {drained['num_outstanding']} streams running")
    return EXIT_OK


def _resume(client: ControllerClient, args: argparse.Namespace) -> int:
    resumed = client.resume(args.worker)
    _print_json(resumed) if args.json else print(f"{args.worker}: {resumed['state']}")
    return EXIT_OK


def _down(client: ControllerClient, args: argparse.Namespace) -> int:
    client.shutdown()
    if args.json:
        _print_json({"shutdown": True})
    else:
        print(f"shutdown requested: the deployment at {client.address} stops its workers and exits")
    return EXIT_OK


def _generate(client: ControllerClient, args: argparse.Namespace) -> int:
    """One choice's text streams as it comes; with --n above 1, each choice's is printed whole,
    in order, once every choice has ended (their chunks interleave). A thinking model's thinking
    goes to stderr, as it comes, after `thinking: ` (each choice's, with --n, before its text)."""
    started_s = time.monotonic()
    last: dict[int, dict[str, Any]] = {}  # each choice's latest chunk, by index
    texts: dict[int, list[str]] = {}
    thoughts: dict[int, list[str]] = {}
    for chunk in client.generate(
        args.prompt,
        chat=args.chat,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
        n=args.n,
        timeout_s=args.timeout,
    ):
        last[chunk["index"]] = chunk
        if args.json:
            print(json.dumps(chunk), flush=True)
        elif args.n == 1:
            if chunk.get("reasoning"):
                if not thoughts:
                    print("thinking: ", end="", file=sys.stderr)
                thoughts.setdefault(chunk["index"], []).append(chunk["reasoning"])
                print(chunk["reasoning"], end="", file=sys.stderr, flush=True)
            print(chunk["text"], end="", flush=True)
        else:
            texts.setdefault(chunk["index"], []).append(chunk["text"])
            thoughts.setdefault(chunk["index"], []).append(chunk.get("reasoning") or "")
    if not args.json:
        for index in sorted(texts):
            print(f"[choice {index}]")
            if "".join(thoughts[index]):
                print("thinking: " + "".join(thoughts[index]), file=sys.stderr)
            print("".join(texts[index]))
        if args.n == 1 and thoughts:
            print(file=sys.stderr)  # the thinking's line ends
        print()
        choices = [last[index] for index in sorted(last)]
        print(generate_footer(choices, time.monotonic() - started_s), file=sys.stderr)
    return EXIT_OK


def call(handler: Callable[[ControllerClient, argparse.Namespace], int], args) -> int:
    """Run one admin command; a gRPC error becomes a message and an exit code."""
    with ControllerClient(args.controller, timeout_s=args.rpc_timeout) as client:
        try:
            return handler(client, args)
        except RequestValueError as error:  # a value the request cannot carry, named
            print(f"error: {error}", file=sys.stderr)
            return EXIT_USAGE
        except grpc.RpcError as error:
            code = error.code()
            if (
                code is grpc.StatusCode.UNAVAILABLE
                and "failed to connect" in (error.details() or "").lower()
            ):
                print(
                    f"error: no controller at {args.controller} (or it speaks TLS and no "
                    "credentials are known for it: `up` writes them under "
                    f"{credentials.folder_for(args.controller)}; elsewhere set "
                    f"INTENTSERVE_CA_FILE and INTENTSERVE_DEPLOYMENT): {error.details()}",
                    file=sys.stderr,
                )
            else:
                print(f"error: {code.name}: {error.details()}", file=sys.stderr)
            return EXIT_USAGE if code in _BAD_INPUT else EXIT_FAILED


def seconds(text: str) -> float:
    """An argparse type: finite seconds > 0 (argparse names the flag and exits 2 otherwise)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}; allowed: finite seconds > 0")
    return value


def add_parsers(commands) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--controller",
        default=os.environ.get(CONTROLLER_ENV, DEFAULT_CONTROLLER),
        metavar="HOST:PORT",
        help=f"the controller (default: ${CONTROLLER_ENV} or {DEFAULT_CONTROLLER})",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument(
        "--rpc-timeout", type=seconds, default=10.0, metavar="S", help="per call (default 10 s)"
    )

    def add(name: str, handler, help_text: str):
        parser = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        parser.set_defaults(handler=lambda args: call(handler, args))
        return parser

    add("status", _status, "deployment state, policy, and every worker's realized cache")
    add("workers", _workers, "one row per worker: state, realized cache, load")
    explain = add("explain", _explain, "intent -> capability -> decision -> realized -> verdict")
    explain.add_argument("worker", help="worker id (see `intentserve workers`)")
    drain = add(
        "drain",
        _drain,
        "stop routing to a worker and let its streams finish (refused when it would leave fewer "
        "verified replicas than minReady, unless --force)",
    )
    drain.add_argument("worker", help="worker id")
    drain.add_argument(
        "--force",
        action="store_true",
        help="drain even below minReady: the deployment stops serving until a resume",
    )
    resume = add("resume", _resume, "undo a drain: the worker receives requests again")
    resume.add_argument("worker", help="worker id")
    add("down", _down, "shut the deployment down (the `up` process stops its workers and exits)")
    gen = add("generate", _generate, "generate text through the controller, streaming tokens")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=64, metavar="N")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    gen.add_argument("--top-k", type=int, default=0, metavar="K", help="0 disables top-k")
    gen.add_argument("--top-p", type=float, default=0.0, metavar="P", help="0 means unset (1.0)")
    gen.add_argument("--seed", type=int, default=None, help="for reproducible sampling")
    gen.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    gen.add_argument(
        "--n", type=int, default=1, metavar="N", help="choices, forked from the prompt (default 1)"
    )
    gen.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")
    gen.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        metavar="S",
        help="the request's deadline, held by the controller (default none)",
    )
