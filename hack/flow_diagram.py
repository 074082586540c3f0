"""Draw docs/flow.svg, the flow of a FineTuneJob, from the text below (no browser, no CDN).

    python hack/flow_diagram.py           # writes docs/flow.svg
    python hack/flow_diagram.py --check   # exit 1 when docs/flow.svg is not what the text draws

tests/unit/test_docs_layout.py runs the check, so the picture changes only with its text here.
"""

from __future__ import annotations

import argparse
import sys
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "flow.svg"

# Each step: its title, what it is in the cluster, what it does. Arrows go from each to the next.
STEPS = [
    (
        "FineTuneJob",
        "kubectl apply -f job.yaml",
        "the operator watches it and mirrors every step into its status",
    ),
    (
        "Preparation",
        "Job NAME-prepare, CPU only",
        "downloads the model and data once, checks, tokenizes, estimates",
    ),
    (
        "Training",
        "PyTorchJob NAME-train, 1 or more GPUs",
        "checkpoints on the volume NAME-ckpt, resumes after preemption",
    ),
    ("Registration", "Job NAME-register, no GPU", "the model into MLflow: a registered version (and alias)"),
]
ARROWS = ["creates", "prepared: creates", "succeeded: creates"]

WIDTH = 640
BOX_W = 560
BOX_H = 78
GAP = 44
MARGIN = 16
FONT = "-apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"


def render() -> str:
    height = MARGIN * 2 + len(STEPS) * BOX_H + (len(STEPS) - 1) * GAP
    x = (WIDTH - BOX_W) // 2
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" role="img" aria-label="The flow of a FineTuneJob">',
        "<title>A FineTuneJob: preparation, training, registration</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" markerHeight="8" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        f'<g font-family="{FONT}" fill="#222">',
    ]
    for i, (title, what, does) in enumerate(STEPS):
        y = MARGIN + i * (BOX_H + GAP)
        fill = "#e8eaf6" if i == 0 else "#f5f5f5"
        out += [
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="8" fill="{fill}" stroke="#3f51b5" '
            'stroke-width="1.5"/>',
            f'<text x="{x + 16}" y="{y + 26}" font-size="17" font-weight="bold">{escape(title)}</text>',
            f'<text x="{x + BOX_W - 16}" y="{y + 26}" font-size="13" text-anchor="end" '
            f'font-family="monospace">{escape(what)}</text>',
            f'<text x="{x + 16}" y="{y + 56}" font-size="14">{escape(does)}</text>',
        ]
        if i < len(ARROWS):
            top, bottom = y + BOX_H, y + BOX_H + GAP
            out += [
                f'<line x1="{WIDTH // 2}" y1="{top}" x2="{WIDTH // 2}" y2="{bottom - 2}" stroke="#555" '
                'stroke-width="1.5" marker-end="url(#arrow)"/>',
                f'<text x="{WIDTH // 2 + 10}" y="{top + GAP // 2 + 5}" font-size="13" '
                f'fill="#555">{escape(ARROWS[i])}</text>',
            ]
    out += ["</g>", "</svg>"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="compare with docs/flow.svg, write nothing")
    args = p.parse_args(argv)
    svg = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != svg:
            print(f"{OUT} is stale: run python hack/flow_diagram.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(svg)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
