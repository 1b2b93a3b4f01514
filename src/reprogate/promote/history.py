"""`reprogate history`: the commits that changed production, from git.

Each line names the model the commit put there (read from that commit's models/production.json,
so a revert shows what it restored). A change that neither `reprogate promote` made (its subject)
nor a promotion tag names is marked unverified: a hand-made commit can put any record there.
"""

from __future__ import annotations

import json
from pathlib import Path

from reprogate.predict.production import made_by_promote
from reprogate.records.production import PROMOTION_STAGE as STAGE
from reprogate.records.production import is_promotion
from reprogate.utils import git
from reprogate.utils.paths import PRODUCTION, PROMOTED


def history(root: Path) -> str:
    """The commits that changed production, newest first, each with the model it put there
    (read from that commit's models/production.json, so a revert shows what it restored);
    `[files kept]` marks versions whose promoted files are in models/.promoted/, so reverting
    to them takes effect at once."""
    log = git.run(root, "log", "--format=%h %ad %s", "--date=short", "--", str(PRODUCTION))
    tagged = set(git.run(root, "tag", "--list", f"*#{STAGE}#*", "--format=%(*objectname:short)").split())
    lines = []
    for line in log.splitlines():
        commit, date, subject = line.split(" ", 2)
        shown = git.run(root, "show", f"{commit}:{PRODUCTION}", check=False)
        try:
            version = json.loads(shown).get("model_version") if shown else None
        except (json.JSONDecodeError, AttributeError):
            version = None
        kept = isinstance(version, str) and "@" in version and (root / PROMOTED / version).is_dir()
        made = made_by_promote(subject, commit in tagged)
        marks = ("  [files kept]" if kept else "") + ("" if made else "  [unverified: not made by promote]")
        lines.append(f"{commit} {date} {version or '(none)'}  {subject}{marks}")
    tags = git.run(root, "tag", "--list", f"*#{STAGE}#*", "--format=%(refname:short) -> %(*objectname:short)")
    promotions = sum(is_promotion(line.split(" ", 2)[2]) for line in log.splitlines())
    untagged = promotions - len(tags.splitlines())
    note = (
        f"\n\n{untagged} promotion commit(s) above have no tag in this clone (tags are not fetched by "
        "every clone: `git fetch --tags`); `promote` numbers the next tag after them all the same."
        if untagged > 0
        else ""
    )
    return ("\n".join(lines) or "(no promotions yet)") + ("\n\ntags:\n" + tags if tags else "") + note
