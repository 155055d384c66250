"""`intentserve ca DIR`: make a CA for a deployment that keeps one across runs or spans machines
(a Ray cluster, Kubernetes): `ca.crt` and an owner-only `ca.key` in DIR, for
`spec.security.caCertFile` / `caKeyFile` (on Kubernetes: `kubectl create secret tls
intentserve-ca --cert=DIR/ca.crt --key=DIR/ca.key`). `up` issues every certificate from it.
Rotating it is making a new one, updating the Secret or files, and restarting `up`: every
certificate is issued afresh at start-up."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from intentserve.controller.cli.admin import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    from intentserve.controller.launch.pki import DeploymentCa  # cryptography, only here

    folder = Path(args.dir)
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
    ca.set_defaults(handler=run)
