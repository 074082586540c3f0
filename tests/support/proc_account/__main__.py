"""``python -m tests.support.proc_account FILE``: the run's CPU by kind of process, as a Markdown table."""

from __future__ import annotations

import sys
from pathlib import Path

from .proc_account_core import summary


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.proc_account FILE", file=sys.stderr)
        return 2
    rows = summary(Path(argv[0]))
    if not rows:
        print(f"{argv[0]}: no records (was KUBETUNE_PROC_ACCOUNT set for the run?)", file=sys.stderr)
        return 1
    total = sum(r[2] for r in rows)
    print("| process | count | CPU s | share | CPU s each | wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for what, n, cpu, wall, each in rows:
        print(f"| {what} | {n} | {cpu:,.0f} | {cpu / total:.0%} | {each:.1f} | {wall:,.0f} |")
    print(f"| all | {sum(r[1] for r in rows)} | {total:,.0f} | 100% | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
