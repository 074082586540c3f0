"""Download and trim the wheels `hack/gpu/peers.sh` installs on the device machine (no network there).

    python3 hack/gpu/peer_wheels.py            # -> .peer-wheels/kubetune/*.whl, .peer-wheels/unsloth/*.whl
    python3 hack/gpu/peer_wheels.py --src      # + .peer-wheels/src: the committed tree (git archive HEAD)

``--src`` is for a helper's worktree: the device call sends the session's own checkout, so the code to
measure travels in the same git-ignored folder as the wheels (``carry=[".peer-wheels"]``, then
``cd .peer-wheels/src && bash hack/gpu/peers.sh .. lora full``).

Two sets, each installed into its own `pip install --target` folder there:

* ``kubetune``: what kubetune's cases, the notebooks and TRL at its best train with and the device
  image lacks (TRL, Liger, datasets 5, PEFT, pydantic for the API models, torchao, dill, multiprocess);
* ``unsloth``: Unsloth's own environment, first on ``PYTHONPATH`` for its cases only (``kubetune bench
  --unsloth-site``): Unsloth and its zoo, the older TRL (<= 1.15) and datasets (< 5) they pin,
  bitsandbytes, xformers and Unsloth's small pure-Python needs.

The device call carries 64 MiB in all, so two wheels are trimmed of what training never loads: the
``unsloth`` wheel's ``studio`` folder (a web UI's front and back end, ~80 MB unpacked) and its CLI,
and bitsandbytes' libraries for every CUDA and ROCm version but the device torch's (CUDA 13.0).
A trimmed wheel's RECORD lists only the files it keeps.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PLATFORM = ["--python-version", "3.12", "--implementation", "cp"] + [
    arg
    for tag in (
        "manylinux_2_28_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_24_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
    )
    for arg in ("--platform", tag)
]

KUBETUNE = [
    "trl==1.16.0",
    "liger-kernel==0.8.5",
    "datasets==5.2.0",
    "peft==0.21.2",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "torchao==0.17.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
]
UNSLOTH = [
    "unsloth==2026.10.9",
    "unsloth-zoo==2026.10.9",
    "trl==1.15.0",
    "datasets==4.8.5",
    "bitsandbytes==0.50.2",
    "xformers==0.0.35",
    "tyro==1.0.16",
    "docstring-parser==0.18.0",
    "typeguard==4.6.1",
    "shtab==1.13.0",
    "cut-cross-entropy==25.1.1",
    "msgspec==0.22.0",
    "structlog==26.1.0",
    "json5==0.17.3",
    "nest-asyncio==1.6.0",
]
# (wheel name prefix, what to drop: a path prefix inside the wheel, or a file suffix to keep exactly one)
TRIMS = {
    "unsloth-": lambda name: name.startswith(("studio/", "unsloth_cli/")),
    "bitsandbytes-": lambda name: (
        name.startswith("bitsandbytes/libbitsandbytes_") and not name.endswith(("_cuda130.so", "_cpu.so"))
    ),
}


def download(specs: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *PLATFORM]
    subprocess.run([*cmd, "-d", str(folder), *specs], check=True)


def trim(wheel: Path, drop: object) -> None:
    """Rewrite ``wheel`` without the files ``drop`` names (and without their RECORD lines)."""
    kept = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(kept, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if drop(info.filename):  # type: ignore[operator]
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(x for x in lines if not drop(x.split(",")[0])) + "\n").encode()  # type: ignore[operator]
            dst.writestr(info, data)
    kept.replace(wheel)


def source(folder: Path) -> None:
    """Write the committed tree (``git archive HEAD``) into ``folder``, replacing what was there."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Download and trim the wheels hack/gpu/peers.sh installs on the device machine."
    )
    parser.add_argument("--out", default=".peer-wheels", help="the folder to write (default: .peer-wheels)")
    parser.add_argument(
        "--src", action="store_true", help="also write the committed tree (git archive HEAD) into OUT/src"
    )
    args = parser.parse_args(argv)
    root = Path(args.out)
    download(KUBETUNE, root / "kubetune")
    download(UNSLOTH, root / "unsloth")
    for wheel in sorted(root.glob("*/*.whl")):
        for prefix, drop in TRIMS.items():
            if wheel.name.startswith(prefix):
                trim(wheel, drop)
    total = sum(p.stat().st_size for p in root.glob("*/*.whl"))
    for wheel in sorted(root.glob("*/*.whl")):
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.relative_to(root)}")
    print(f"{total / 2**20:7.2f} MiB in all")
    if args.src:
        source(root / "src")
        code = sum(p.stat().st_size for p in (root / "src").rglob("*") if p.is_file())
        print(f"{code / 2**20:7.2f} MiB of source in {root / 'src'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
