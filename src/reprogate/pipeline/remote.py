"""`reprogate remote [URL]` (`make remote URL=…`): the shared DVC remote a team reproduces from.

A local folder (one machine, or a disk every teammate mounts at the same path) works with DVC
alone; s3://, gs://, azure:// and ssh:// need DVC's plugin for that storage, which is said by
name when it is missing. The remote becomes the project's default in .dvc/config, a tracked
file: committed, every clone pushes to and pulls from the same place (`--local` keeps it in
.dvc/config.local instead, for one person's copy). With a remote, `make repro` restores what
it holds (outputs and the run-cache) and runs only what is missing, and
`reprogate promote --push` publishes a promotion's outputs before it commits.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import urlsplit

from reprogate.utils import dvc_cli
from reprogate.utils.errors import UserError

NAME = "shared"
# Beside the project, like ../shared: outside it, so no clone of the project carries a copy.
DEFAULT_URL = "../reprogate-remote"
PLUGINS = {"s3": "dvc_s3", "gs": "dvc_gs", "azure": "dvc_azure", "ssh": "dvc_ssh"}


def _local(root: Path, url: str) -> str:
    path = Path(url.removeprefix("file://")).expanduser()
    path = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if path.is_relative_to(root.resolve()):
        raise UserError(
            f"remote {url} resolves to {path}, inside the project: DVC would track or ignore its "
            "own cache there. Put the remote outside the project (the default is ../reprogate-remote)."
        )
    if path.exists() and not path.is_dir():
        raise UserError(f"remote {url} resolves to {path}, which is a file: name a folder.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"remote {url}: cannot create the folder {path} ({e.strerror or e}).") from None
    return str(path)


def _checked(root: Path, url: str) -> str:
    """The URL as DVC should store it: a local folder absolute and created; an object store's
    URL as given, once the plugin that reaches it is installed."""
    scheme = urlsplit(url).scheme
    if scheme in ("", "file") or len(scheme) == 1:  # a path (a drive letter is not a scheme)
        return _local(root, url)
    if scheme in PLUGINS:
        if importlib.util.find_spec(PLUGINS[scheme]) is None:
            extra = PLUGINS[scheme].replace("_", "-")
            raise UserError(
                f"remote {url}: {scheme}:// needs DVC's {extra} plugin, which is not installed; install "
                f"it into the project's environment (`.venv/bin/pip install {extra}`) and add it to "
                "requirements.lock (`make lock`) so every clone has it, then run this again."
            )
        return url
    accepted = "a local folder, " + ", ".join(f"{s}://" for s in PLUGINS)
    raise UserError(f"remote {url}: '{scheme}://' is not a storage reprogate configures; use {accepted}.")


def configure(root: Path, url: str | None = None, local: bool = False) -> str:
    stored = _checked(root, url or DEFAULT_URL)
    dvc_cli.run(root, "remote", "add", "--default", "--force", *(["--local"] if local else []), NAME, stored)
    where = (
        ".dvc/config.local (this copy only)" if local else ".dvc/config: commit it, and every clone shares it"
    )
    return (
        f"remote: '{NAME}' -> {stored} is the default DVC remote ({where}). `make repro` now restores "
        "what it holds before running anything, `dvc push --run-cache` publishes this workspace's "
        "outputs, and `reprogate promote --push` publishes a promotion's."
    )
