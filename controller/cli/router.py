"""`intentserve router MANIFEST --controller HOST:PORT`: one more router of a running deployment,
in a process of its own (one per node, or N behind a Service).

It learns the verified worker table from the controller's watch (`--controller`: the
controller's registry address, the mutual-TLS port where workers register; on an insecure
deployment, its only port) and streams from the workers itself. Clients call it as they call
the controller: `Inference` (with the manifest's API keys), health, and `status`. Its keys
follow `up`'s rule (`client_keys`): where `up` would make a key (`plaintextHttp`, no
`apiKeysFile`) a router cannot know it and refuses to start (exit 2), unless
`spec.security.insecureOpenInference` says to serve inference open, which it then says loudly.

Its identity: with TLS, a certificate of the deployment's CA named `router`, from `--tls-dir`
(`ca.crt`, `router.crt`, `router.key`: `intentserve ca DIR --router --deployment NAME`), or
issued at start from `spec.security.caCertFile` / `caKeyFile`. On an insecure deployment it
presents the admin token (`spec.security.adminTokenFile`, else the one `up` saved for the
controller's address on this machine).

While the controller is unreachable it serves its last verified table for
`spec.router.maxStaleS` seconds (default 30; `--max-stale-s`) and reports it stale; past that,
health is NOT_SERVING and requests are refused naming why.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from pathlib import Path

from intentserve.client import credentials
from intentserve.common.tls import ROUTER, TlsIdentity
from intentserve.controller.auth import Security, SecurityError, read_secret_lines
from intentserve.controller.cli.admin import EXIT_FAILED, EXIT_OK, EXIT_USAGE, seconds
from intentserve.controller.cli.logs import add_logging_arguments, configure_logging
from intentserve.controller.launch.client_keys import ClientKeys, client_keys
from intentserve.controller.launch.manifest import Manifest, ManifestError, load_manifest
from intentserve.policy import IntentError


def run(args: argparse.Namespace) -> int:
    try:
        # NOTE: not checked as one node's: where workers go (placement, memory shares) is `up`'s
        # concern, and a router runs on any node of a cluster.
        manifest = load_manifest(args.manifest, one_node=False)
    except ManifestError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        keys = client_keys(manifest.spec.security, may_make=False)
        security = router_security(manifest, args.controller, args.tls_dir, keys)
    except SecurityError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if (warning := keys.warning("this router")) is not None:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    from intentserve.controller.launch.router_spec import router_config
    from intentserve.controller.router.server import RouterServer

    config = router_config(manifest, args.controller, security)
    overrides = {
        "host": args.host,
        "port": args.port,
        "http_port": args.http_port,
        "max_stale_s": args.max_stale_s,
    }
    config = dataclasses.replace(config, **{k: v for k, v in overrides.items() if v is not None})
    configure_logging(args.log_format, args.log_level)
    try:
        server = RouterServer(config).start()
    except IntentError as error:  # INTENTSERVE_EVENT_LOOP names no loop it can run
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as error:  # the port is taken or the host is not ours
        print(
            f"error: cannot start the router on {config.host}:{config.port}: {error}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    tls = security.tls
    saved = credentials.save(
        server.address,
        manifest.name,
        tls.ca_pem if tls is not None else None,
        min(security.admin_tokens) if security.admin_tokens else None,
        server=ROUTER,
    )
    print(
        f"router of {manifest.name} listening on {config.host}:{server.bound_port}, watching "
        f"the controller at {config.controller} (a stale table is served for "
        f"{config.max_stale_s:g} s at most); the CLI's credentials are in {saved}"
        + (f"; HTTP API on {server.http_url}" if server.http_url else ""),
        flush=True,
    )
    try:
        stopped.wait()
    finally:
        server.stop()
        credentials.remove(server.address)
    return EXIT_OK


def router_security(
    manifest: Manifest, controller: str, tls_dir: str | None, keys: ClientKeys
) -> Security:
    """The router's certificate (TLS) or the admin token it presents (insecure), and the API
    keys its clients must present (`keys`: `client_keys`, the rule `up` follows too)."""
    s = manifest.spec.security
    tokens = frozenset()
    if s.admin_token_file:
        tokens = read_secret_lines(s.admin_token_file, "spec.security.adminTokenFile")
    elif (saved := credentials.load(controller).admin_token) is not None:
        tokens = frozenset({saved})
    else:
        # NOTE: never an open status: it shows every worker's address.
        raise SecurityError(
            "spec.security.adminTokenFile: a router needs the deployment's admin token (its "
            "status is for operators only; insecure, it also proves the router to the "
            "controller): give the file, or run it where `up` saved the token for "
            f"{controller}"
        )
    if s.insecure:
        return Security(None, tokens, keys.api_keys)
    return Security(_identity(manifest, tls_dir), tokens, keys.api_keys)


def _identity(manifest: Manifest, tls_dir: str | None) -> TlsIdentity:
    s = manifest.spec.security
    if tls_dir is not None:
        folder = Path(tls_dir)
        try:
            return TlsIdentity(
                *((folder / name).read_bytes() for name in ("ca.crt", "router.crt", "router.key"))
            )
        except OSError as error:
            raise SecurityError(f"--tls-dir {folder}: {error.strerror or error}") from None
    if s.ca_cert_file is None:
        raise SecurityError(
            "--tls-dir: a router needs a certificate of the deployment's CA: give --tls-dir "
            "(intentserve ca DIR --router --deployment NAME), or spec.security.caCertFile and "
            "caKeyFile; the CA `up` makes for itself never leaves its process"
        )
    from intentserve.controller.launch.pki import DeploymentCa, PkiError

    try:
        ca = DeploymentCa.load(manifest.name, Path(s.ca_cert_file), Path(s.ca_key_file))
    except PkiError as error:
        raise SecurityError(str(error)) from None
    host = manifest.spec.router.host
    return ca.router_identity(() if host in ("0.0.0.0", "::") else (host,))


def add_parser(commands) -> None:
    router = commands.add_parser(
        "router",
        help="run one more router of a running deployment (the request path, in its own process)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    router.add_argument("manifest", help="the deployment's manifest (the one `up` runs)")
    router.add_argument(
        "--controller",
        required=True,
        metavar="HOST:PORT",
        help="the controller's registry address (with TLS, the port workers register on)",
    )
    router.add_argument("--host", default=None, help="where it listens (spec.router.host)")
    router.add_argument(
        "--port", type=int, default=None, help="its port (spec.router.port; 0 picks a free one)"
    )
    router.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="the OpenAI HTTP API, /health and /metrics (spec.router.httpPort; default none)",
    )
    router.add_argument(
        "--max-stale-s",
        type=seconds,
        default=None,
        metavar="S",
        help="serve the last table this long without the controller (spec.router.maxStaleS)",
    )
    router.add_argument(
        "--tls-dir",
        default=None,
        metavar="DIR",
        help="ca.crt, router.crt and router.key (intentserve ca DIR --router)",
    )
    add_logging_arguments(router)
    router.set_defaults(handler=run)
