"""README stays true: the policy table is the implemented one and CI runs the README's command."""

import re
from pathlib import Path

from intentserve.controller.cli.main import main
from intentserve.policy.examples import decision_table, render_markdown

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_policy_table_is_the_implemented_one():
    block = re.search(r"<!-- policy-table:begin -->\n(.*?)<!-- policy-table:end -->", README, re.S)
    assert block, "README lost its policy-table markers"
    assert block.group(1).strip() == render_markdown(decision_table())


def test_cli_prints_the_same_table(capsys):
    assert main(["policy-table", "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == render_markdown(decision_table())


def test_ci_runs_the_readme_test_command():
    quickstart = re.search(r"## Quickstart.*?```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in quickstart.strip().splitlines()]
    assert len(commands) == 2, "the quickstart is exactly two commands"
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))
    ]
    assert ci == [commands[1]]
