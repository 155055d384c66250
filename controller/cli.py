"""The `intentserve` command line.

Exit codes: 0 success; 1 the operation failed (e.g. a policy could not be realized);
2 bad input (an invalid flag, mode or manifest field: the message names it).
"""

from __future__ import annotations

import argparse
import sys

from policy.examples import decision_table, render_markdown

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


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
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    table = commands.add_parser(
        "policy-table",
        help="print the PagedAttention decision table the controller enforces",
        description="Resolve every mode against example workers and print the outcome and reason.",
    )
    table.add_argument("--markdown", action="store_true", help="print a Markdown table")
    table.set_defaults(handler=_policy_table)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
