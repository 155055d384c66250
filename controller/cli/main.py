"""The `intentserve` command line.

    intentserve serve smollm2-135m            # serve one model, no manifest needed
    intentserve up deploy/local.yaml          # bring a deployment up and serve it
    intentserve router deploy/local.yaml --controller HOST:PORT   # one more router
    intentserve status | workers | explain W | drain W | resume W | down | generate PROMPT
    intentserve policy-table                  # the decision table the controller enforces

Exit codes: 0 success; 1 the operation failed (e.g. a policy could not be realized, the
controller is unreachable); 2 bad input (an invalid flag, mode or manifest field, an unknown
worker: the message names it).
"""

from __future__ import annotations

import argparse
import os
import sys

# NOTE: set before grpc is imported (it reads it once): `up` starts Ray, which fork + execs its
# processes while the controller's gRPC threads run; gRPC's fork handlers have nothing to do
# there and would only log that they skip.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from intentserve import __version__  # noqa: E402
from intentserve.controller.cli import admin as cli_admin  # noqa: E402
from intentserve.controller.cli import ca as cli_ca  # noqa: E402
from intentserve.controller.cli import router as cli_router  # noqa: E402
from intentserve.controller.cli import serve as cli_serve  # noqa: E402
from intentserve.controller.cli import up as cli_up  # noqa: E402
from intentserve.controller.cli.admin import EXIT_OK  # noqa: E402
from intentserve.policy.examples import decision_table, render_markdown  # noqa: E402


def _policy_table(args: argparse.Namespace) -> int:
    rows = decision_table()
    if args.markdown:
        print(render_markdown(rows))
        return EXIT_OK
    width = max(len(r.situation) for r in rows)
    print(f"{'worker':<{width}}  {'mode':<4}  {'outcome':<30}  reason")
    for r in rows:
        print(f"{r.situation:<{width}}  {r.mode.value:<4}  {r.outcome:<30}  {r.reason}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="intentserve",
        description="LLM serving where the operator's configuration is a policy, not a hint.",
    )
    parser.add_argument("--version", action="version", version=f"intentserve {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    table = commands.add_parser(
        "policy-table",
        help="print the PagedAttention decision table the controller enforces",
        description="Resolve every mode against example workers and print the outcome and reason.",
    )
    table.add_argument("--markdown", action="store_true", help="print a Markdown table")
    table.set_defaults(handler=_policy_table)
    cli_up.add_parser(commands)
    cli_serve.add_parser(commands)
    cli_router.add_parser(commands)
    cli_ca.add_parser(commands)
    cli_admin.add_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:  # `intentserve status | head -1`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
