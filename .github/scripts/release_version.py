"""The release's one version: a tag ``v<version>`` releases only a chart whose ``version`` and
``appVersion`` are both ``<version>``, because the chart's default image tag is its appVersion and the
release workflow tags the images with that version.

Prints ``version=<version>`` (a line for ``$GITHUB_OUTPUT``) and exits 0, or names what differs and
exits 1. Standard library only: it runs on the bare runner before anything is installed.

    python3 .github/scripts/release_version.py v0.1.0
    python3 .github/scripts/release_version.py v0.1.0 --chart charts/kubetune/Chart.yaml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

CHART = Path(__file__).resolve().parents[2] / "charts" / "kubetune" / "Chart.yaml"
# SemVer 2.0 without build metadata: Helm turns `+` into `_` in OCI tags, and image tags cannot hold it.
TAG = re.compile(r"v(?P<version>(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?)")
_TOP_LEVEL = re.compile(r"(?P<key>[A-Za-z]+):\s*(?P<value>.*?)\s*$")


class VersionMismatchError(Exception):
    """The tag, the chart's version and its appVersion are not one version."""


def chart_versions(chart_yaml: str) -> tuple[str, str]:
    """``version`` and ``appVersion`` of a Chart.yaml: top-level scalars, quoted or not."""
    found: dict[str, str] = {}
    for line in chart_yaml.splitlines():
        match = _TOP_LEVEL.fullmatch(line)
        if match and match["key"] in ("version", "appVersion"):
            found[match["key"]] = match["value"].split(" #", 1)[0].strip().strip("\"'")
    missing = {"version", "appVersion"} - found.keys()
    if missing:
        raise VersionMismatchError(f"Chart.yaml has no {', '.join(sorted(missing))}")
    return found["version"], found["appVersion"]


def release_version(tag: str, chart_yaml: str) -> str:
    """The version a tag releases, once the chart agrees with it."""
    match = TAG.fullmatch(tag)
    if match is None:
        raise VersionMismatchError(f"tag {tag!r} is not v<MAJOR>.<MINOR>.<PATCH>[-<pre-release>]")
    version = match["version"]
    chart_version, app_version = chart_versions(chart_yaml)
    wrong = [
        f"{name} is {value!r}"
        for name, value in (("the chart's version", chart_version), ("its appVersion", app_version))
        if value != version
    ]
    if wrong:
        raise VersionMismatchError(
            f"tag {tag} releases {version}, but {' and '.join(wrong)}: set both in Chart.yaml to "
            f"{version} and tag again"
        )
    return version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag", help="the pushed tag, e.g. v0.1.0")
    parser.add_argument("--chart", type=Path, default=CHART, help="the chart's Chart.yaml")
    args = parser.parse_args(argv)
    try:
        version = release_version(args.tag, args.chart.read_text())
    except VersionMismatchError as e:
        print(f"release_version: {e}", file=sys.stderr)
        return 1
    print(f"version={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
