"""`intentserve up MANIFEST`: bring a deployment up, serve it, take it down.

manifest -> controller (health NOT_SERVING) -> Ray (embedded, or `--ray-address`) -> one worker
actor per replica -> progress until the deployment is READY -> status table -> serve until
Ctrl-C, SIGTERM or `intentserve down` -> controller stopped, actors killed, Ray shut down.
A deployment already running (another `up` holds it) is named and refused; the live workers a
killed `up` left on a joined Ray cluster are adopted, and verified again without reloading.

Exit codes: 0 clean shutdown after serving; 1 the policy could not be realized (the worker's
reason is printed), start-up failed, or workers whose restart budget is spent leave too few to
meet minReady (each named with its last error), or the deployment is already running; 2 bad
manifest (the field, the value, what is allowed). A failure once the controller is up stops
everything first, then prints the error last.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys

from intentserve.client import credentials
from intentserve.controller.cli.admin import EXIT_FAILED, EXIT_USAGE
from intentserve.controller.cli.bring_up import UpFailed, bring_up, install_signals
from intentserve.controller.cli.logs import add_logging_arguments, configure_logging
from intentserve.controller.cli.progress import Progress
from intentserve.controller.launch.deployment_dir import DeploymentDir, DeploymentRunning, UpRecord
from intentserve.controller.launch.manifest import Manifest, ManifestError, load_manifest
from intentserve.controller.launch.ray_target import choose_ray_target
from intentserve.controller.launch.replicas import registry_port_kept
from intentserve.controller.launch.security import (
    DeploymentSecurity,
    SecurityError,
    describe_security,
)
from intentserve.controller.launch.types import LaunchError
from intentserve.controller.server import ControllerServer
from intentserve.policy import IntentError

# `--paged-attention MODE` is the manifest field's env override, so it is validated (and its error
# names spec.pagedAttention.mode) exactly as the file's value would be.
PAGED_ATTENTION_ENV = "INTENTSERVE_SPEC__PAGEDATTENTION__MODE"


def run(args: argparse.Namespace) -> int:
    if args.paged_attention is not None:
        os.environ[PAGED_ATTENTION_ENV] = args.paged_attention
    try:
        # NOTE: RAY_ADDRESS joins a cluster as --ray-address does (ray_target.py)
        manifest = load_manifest(
            args.manifest, one_node=choose_ray_target(args.ray_address).embedded
        )
    except ManifestError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return launch(manifest, args.manifest, args)


def launch(manifest: Manifest, source: str, args: argparse.Namespace) -> int:
    """Bring the validated `manifest` up and serve it (what `up` and `serve` share); `args`
    has the Ray and logging flags of `add_launch_arguments`."""
    embedded = choose_ray_target(args.ray_address).embedded  # every replica on this one node
    shared = None if embedded else manifest.shared_kv_problem()
    if shared is not None:
        print(f"warning: {shared} (if Ray places them on one node)", file=sys.stderr)
    configure_logging(args.log_format, args.log_level)
    state = DeploymentDir(credentials.home(), manifest.name)
    try:
        earlier = state.claim()
    except DeploymentRunning as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    try:
        return _claimed(manifest, source, args, state, earlier)
    finally:
        state.unlock()  # NOTE: after a clean stop the folder is gone already


def _claimed(
    manifest: Manifest,
    source: str,
    args: argparse.Namespace,
    state: DeploymentDir,
    earlier: UpRecord | None,
) -> int:
    progress = Progress()
    s = manifest.spec
    progress.say(
        f"manifest {source}: deployment {manifest.name}, {s.replicas} x {s.model.name} on "
        f"{s.resources.device.value}, pagedAttention {s.paged_attention.mode.value}"
    )
    try:
        prepared = DeploymentSecurity.prepare(manifest, state)
    except SecurityError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if (warning := prepared.keys.warning("the controller")) is not None:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    ray_target = choose_ray_target(args.ray_address)
    config = registry_port_kept(
        dataclasses.replace(manifest.controller_config(), security=prepared.security),
        earlier,
        ray_target,
    )
    try:
        server = ControllerServer(config).start()
    except IntentError as error:  # INTENTSERVE_EVENT_LOOP names no loop it can run
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as error:  # the port is taken or the host is not ours
        c = s.controller
        kept = ""
        if earlier is not None and config.registry_port != c.registry_port:
            kept = (
                f" and the workers' registry port {config.registry_port} (the one the workers "
                f"of the killed `up` pid {earlier.pid} know)"
            )
        print(
            f"error: cannot start the controller on {c.host}:{c.port}{kept}: {error}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    state.record(UpRecord(os.getpid(), server.address, server.registry_port, ray_target.address))
    previous = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    install_signals(server, progress.signals)
    saved = credentials.save(
        server.address,
        manifest.name,
        prepared.ca.cert_pem if prepared.ca else None,
        prepared.admin_token,
    )
    progress.say(
        f"controller listening on {config.host}:{server.bound_port} "
        f"(health NOT_SERVING until READY); workers register on {server.registry_address}; "
        f"{describe_security(prepared)}; the admin CLI's credentials are in {saved}"
        + (f"; HTTP API on {server.http_url}" if server.http_url else "")
    )
    from intentserve.controller.launch.launcher import (
        RayLauncher,  # ray is imported only when `up` runs
    )

    progress.say(f"ray: {ray_target.describe()}")
    launcher = RayLauncher(
        deployment=manifest.name,
        address=ray_target.address,
        num_cpus=args.ray_num_cpus,
        temp_dir=args.ray_temp_dir,
        log_to_driver=args.worker_logs,
    )
    failure: str | None = None
    try:
        return bring_up(manifest, server, launcher, progress, prepared, args.log_format)
    except (LaunchError, UpFailed) as error:
        failure = str(error)
        progress.say("stopping: the error is printed last")
        return EXIT_FAILED
    finally:
        if progress.signals:
            progress.say(f"{progress.signals[0]}: shutting down")
        server.stop(grace_s=s.controller.drain_timeout_s)
        launcher.shutdown()
        state.remove()  # its workers are gone: nothing is left to adopt
        credentials.remove(server.address)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        ray_after = "Ray shut down" if launcher.embedded else "the Ray cluster left running"
        progress.say(f"stopped: controller down, worker actors killed, {ray_after}")
        if failure is not None:
            print(f"error: {failure}", file=sys.stderr, flush=True)


def _whole_cpus(text: str) -> int:
    """An argparse type: what Ray's num_cpus takes, checked before anything starts."""
    if not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r}; allowed: a whole number of CPUs >= 1")
    return int(text)


def add_parser(commands) -> None:
    up = commands.add_parser(
        "up",
        help="bring up a deployment from a manifest and serve it",
        description=__doc__.split("\n\n")[1],
        epilog=__doc__.split("\n\n")[2],
    )
    up.add_argument("manifest", help="the deployment manifest (e.g. deploy/local.yaml)")
    up.add_argument(
        "--paged-attention",
        default=None,
        metavar="MODE",
        help="auto, on or off: overrides spec.pagedAttention.mode (on: realized on every worker "
        "or the deployment does not start)",
    )
    add_launch_arguments(up)
    up.set_defaults(handler=run)


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `up` and `serve` share: where Ray runs, and the logs."""
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="join this Ray cluster (auto, HOST:6379, ray://HOST:10001; local: start an embedded "
        "one); default: $RAY_ADDRESS when set (as `ray job submit` sets it), else embedded",
    )
    parser.add_argument(
        "--ray-num-cpus",
        type=_whole_cpus,
        default=None,
        metavar="N",
        help="CPUs of the embedded cluster (default: what the replicas need)",
    )
    parser.add_argument(
        "--ray-temp-dir", default=None, metavar="DIR", help="embedded Ray's temp dir"
    )
    parser.add_argument(
        "--worker-logs", action="store_true", help="print the workers' logs here as well"
    )
    add_logging_arguments(parser)
