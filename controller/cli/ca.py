"""`intentserve ca DIR`: make a CA for a deployment that keeps one across runs or spans machines
(a Ray cluster, Kubernetes): `ca.crt` and an owner-only `ca.key` in DIR, for
`spec.security.caCertFile` / `caKeyFile` (on Kubernetes: `kubectl create secret tls
intentserve-ca --cert=DIR/ca.crt --key=DIR/ca.key`). `up` issues every certificate from it.
Rotating it is making a new one, updating the Secret or files, and restarting `up`: every
certificate is issued afresh at start-up.

`intentserve ca DIR --router --deployment NAME` issues a router's certificate from the CA
already in DIR: `router.crt` and an owner-only `router.key`, for `intentserve router --tls-dir
DIR` (with `ca.crt`: the CA's key need not travel with them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from intentserve.controller.cli.admin import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    from intentserve.controller.launch.pki import DeploymentCa  # cryptography, only here

    folder = Path(args.dir)
    if args.router:
        if not args.deployment:
            print("error: --router needs --deployment NAME (metadata.name)", file=sys.stderr)
            return EXIT_USAGE
        return _issue_router(folder, DeploymentCa, args.deployment)
    if (folder / "ca.key").exists() and not args.force:
        print(f"error: {folder / 'ca.key'} exists; --force replaces it", file=sys.stderr)
        return EXIT_USAGE
    try:
        cert_file, key_file = DeploymentCa.create(args.name).write(folder)
    except OSError as error:
        print(f"error: cannot write the CA to {folder}: {error.strerror or error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {cert_file} and {key_file} (owner-only)")
    return EXIT_OK


def add_parser(commands) -> None:
    ca = commands.add_parser(
        "ca", help="make a CA for spec.security.caCertFile / caKeyFile", description=__doc__
    )
    ca.add_argument("dir", help="folder for ca.crt and ca.key")
    ca.add_argument("--name", default="intentserve", help="a name for the CA's certificate")
    ca.add_argument("--force", action="store_true", help="replace an existing ca.key")
    ca.add_argument(
        "--router",
        action="store_true",
        help="issue router.crt and router.key from the CA in DIR (for intentserve router)",
    )
    ca.add_argument(
        "--deployment", metavar="NAME", help="with --router: the deployment (metadata.name)"
    )
    ca.set_defaults(handler=run)


def _issue_router(folder: Path, authority, deployment: str) -> int:
    """router.crt / router.key in `folder`, from its ca.crt and ca.key."""
    from intentserve.controller.launch.pki import PkiError  # cryptography, only here

    try:
        ca = authority.load(deployment, folder / "ca.crt", folder / "ca.key")
        identity = ca.router_identity()
        (folder / "router.crt").write_bytes(identity.cert_pem)
        key_file = folder / "router.key"
        key_file.touch(mode=0o600)
        key_file.write_bytes(identity.key_pem)
    except PkiError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        print(f"error: cannot write to {folder}: {error.strerror or error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {folder / 'router.crt'} and {key_file} (owner-only), of the CA in {folder}")
    return EXIT_OK
