"""`intentserve serve MODEL`: serve one model with the policy defaults, no manifest to write.

MODEL is a short name (smollm2-135m), a .gguf file, a Hugging Face folder or a cached Hugging Face
id. The flags become the manifest's fields (each flag names its field in --help), and the manifest
goes through the same validation and the same launch as `intentserve up`; `--print-manifest`
writes it as YAML instead, a file `up` takes as it is.

On loopback (the default host) the HTTP API is plaintext, so that a local OpenAI client needs no
CA file, and it needs the API key `serve` makes and prints (spec.security.plaintextHttp; README:
Security). gRPC and the workers keep mutual TLS.
"""

from __future__ import annotations

import argparse
import sys

import yaml
from intentserve.common.addresses import is_loopback
from intentserve.controller.cli import up as cli_up
from intentserve.controller.cli.admin import EXIT_OK, EXIT_USAGE
from intentserve.controller.launch.manifest import API_VERSION, KIND, ManifestError, parse_manifest

DEFAULT_NAME = "serve"

# flag -> (manifest path, argparse type, help); a flag not given leaves the field at its default.
FIELDS: dict[str, tuple[str, type, str]] = {
    "--served-name": ("spec.model.servedName", str, "the name clients give as `model`"),
    "--dtype": ("spec.model.dtype", str, "auto, float32, bfloat16 or float16"),
    "--weights": ("spec.model.weights", str, "auto, dequantized, int8, int4 or w8a8"),
    "--chat-template": (
        "spec.model.chatTemplate",
        str,
        "a chat template, or its file (for a checkpoint with none)",
    ),
    "--replicas": ("spec.replicas", int, "worker replicas"),
    "--device": ("spec.resources.device", str, "cpu or cuda"),
    "--num-cpus": ("spec.resources.numCpus", float, "CPUs per worker (also its threads)"),
    "--num-gpus": ("spec.resources.numGpus", float, "GPUs per worker"),
    "--paged-attention": ("spec.pagedAttention.mode", str, "auto, on or off"),
    "--attention-backend": ("spec.pagedAttention.backend", str, "auto, torch, flash, ..."),
    "--kv-cache-memory": ("spec.pagedAttention.kvCacheMemory", str, "e.g. 256Mi or 60%%"),
    "--max-num-seqs": ("spec.scheduler.maxNumSeqs", int, "sequences a worker runs at once"),
    "--max-model-len": ("spec.scheduler.maxModelLen", int, "longest prompt + reply, in tokens"),
    "--host": ("spec.controller.host", str, "where the controller listens"),
    "--port": ("spec.controller.port", int, "gRPC port (0: a free one)"),
    "--http-port": ("spec.controller.httpPort", int, "OpenAI HTTP API port (0: a free one)"),
    "--drain-timeout": ("spec.controller.drainTimeoutS", float, "seconds streams get on stop"),
    "--api-keys-file": ("spec.security.apiKeysFile", str, "clients' keys, one a line"),
}


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def build_document(args: argparse.Namespace) -> dict:
    """The manifest the flags describe, as the YAML an operator would write."""
    document: dict = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": args.name},
        "spec": {"model": {"name": args.model}},
    }
    for flag, (path, _, _) in FIELDS.items():
        value = getattr(args, _dest(flag))
        if value is not None:
            _put(document, path, value)
    host = args.host or "127.0.0.1"
    if is_loopback(host):
        _put(document, "spec.security.plaintextHttp", True)
    return document


def _put(document: dict, path: str, value: object) -> None:
    *parents, leaf = path.split(".")
    node = document
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def run(args: argparse.Namespace) -> int:
    document = build_document(args)
    try:
        manifest = parse_manifest(document, "serve's flags")
        problem = manifest.shared_kv_problem() if args.ray_address is None else None
        if problem is not None:
            raise ManifestError("serve's flags", [problem])
    except ManifestError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.print_manifest:
        print(yaml.safe_dump(document, sort_keys=False), end="")
        return EXIT_OK
    return cli_up.launch(manifest, f"(serve {args.model})", args)


def add_parser(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve one model with the policy defaults (no manifest needed)",
        description=__doc__.split("\n\n")[1],
        epilog=__doc__.split("\n\n")[2],
    )
    serve.add_argument("model", help="short name, .gguf file, folder or cached Hugging Face id")
    serve.add_argument(
        "--name", default=DEFAULT_NAME, help=f"the deployment's name (default {DEFAULT_NAME})"
    )
    for flag, (path, kind, text) in FIELDS.items():
        serve.add_argument(flag, type=kind, default=None, help=f"{text} ({path})")
    serve.add_argument(
        "--print-manifest",
        action="store_true",
        help="write the manifest these flags make (YAML) and exit; `intentserve up` takes it",
    )
    cli_up.add_launch_arguments(serve)
    serve.set_defaults(handler=run)
