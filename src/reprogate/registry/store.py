"""The registry's Delta Lake tables at one location (deltalake, the Rust implementation).

A table is created empty on first use with the schema registry_tables generates, at protocol
reader 1 / writer 2. Rows go in by keyed MERGE: a source row whose key the table holds is not
inserted again, so a second sync of the same records commits no new table version. Two syncs
at once: delta-rs refuses the second commit when the first added rows it had read past (a
commit conflict), and the MERGE is simply run again against the new table version, where it
finds those rows; nothing is lost or doubled.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from reprogate.registry.tables import TABLES
from reprogate.utils.errors import UserError

RETRIES = 30
# The one update a MERGE makes: a row found again at an older commit is dated to that commit.
OLDER_COMMIT = 's."commit" IS NOT NULL AND (t."commit" IS NULL OR s.committed_at < t.committed_at)'
# Older than this, files no version in the window reads are removed by `registry optimize`: a
# week, delta-rs's default, so a reader (or a time-travel query) in progress never loses one.
VACUUM_HOURS = 168


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


class Store:
    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")

    @classmethod
    def at(cls, root: Path, location: str) -> Store:
        """params.yaml's `registry:`: a folder relative to the project, or a URI."""
        if is_local(location):
            path = Path(location.removeprefix("file://"))
            return cls(str(path if path.is_absolute() else (root / path).resolve()))
        return cls(location)

    def path(self, table: str) -> str:
        return f"{self.uri}/{table}"

    def check_writable(self) -> None:
        """A local location is probed before any table is written: one paragraph, nothing half
        made. An object store answers on the first write, which commits nothing when it fails."""
        if not is_local(self.uri):
            return
        folder = Path(self.uri)
        probe = folder / f".probe-{os.getpid()}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise UserError(
                f"registry: cannot write to {folder} ({e.strerror or e}); params.yaml's `registry:` "
                "must name a folder this user can create and write (or an s3://, gs://, abfss:// URI): "
                "fix its permissions or point `registry:` elsewhere. Nothing was written."
            ) from None

    def table(self, name: str) -> DeltaTable | None:
        try:
            return DeltaTable(self.path(name))
        except TableNotFoundError:
            return None
        except (DeltaError, OSError) as e:
            raise self._unreachable(e) from None

    def ensure(self, name: str) -> DeltaTable:
        """The table, created empty with its generated schema if it is not there yet (by this
        sync or by another at the same moment: whichever commits version 0 first, the other
        opens it)."""
        schema = TABLES[name].schema
        table = self.table(name)
        if table is None:
            try:
                DeltaTable.create(self.path(name), schema=schema, mode="ignore", name=name)
            except (DeltaError, OSError) as e:
                if self.table(name) is None:  # not created by a concurrent sync either
                    raise self._unreachable(e) from None
            table = DeltaTable(self.path(name))
        found = pa.schema(table.schema().to_arrow())
        if not found.equals(schema):
            raise UserError(
                f"registry: table {self.path(name)} has columns {found.names}, this reprogate writes "
                f"{schema.names}; it was made by another version: move the registry folder aside "
                "(or point params.yaml's `registry:` at a new location) and sync again."
            )
        return table

    def read(self, name: str, columns: list[str] | None = None) -> pa.Table:
        table = self.table(name)
        if table is None:
            return TABLES[name].schema.empty_table().select(columns or TABLES[name].schema.names)
        return table.to_pyarrow_dataset().to_table(columns=columns)

    def damaged(self, whole: bool = True) -> dict[str, str]:
        """Table -> why, for each table whose current version names a file that cannot be read
        (truncated, overwritten, gone). `whole`: every byte of every file, as `check --repair`
        does; otherwise each file's footer only, as every sync does first (milliseconds)."""
        import pyarrow.parquet as pq

        out = {}
        for name in TABLES:
            try:
                table = self.table(name)
                for uri in table.file_uris() if table else []:
                    try:
                        path = uri.removeprefix("file://") if is_local(uri) else uri
                        pq.read_table(path) if whole else pq.read_metadata(path)
                    except (pa.ArrowException, OSError) as e:
                        out[name] = f"{uri.rsplit('/', 1)[-1]}: {str(e).splitlines()[0]}"
                        break
            except UserError as e:  # its commit log cannot be read at all
                out[name] = str(e)
        return out

    def set_aside(self, name: str, stamp: str) -> str:
        """Move a damaged local table under .damaged/ (kept, never deleted); where it went."""
        if not is_local(self.uri):
            raise UserError(
                f"registry: table {self.path(name)} is damaged; in object storage, move it aside with the "
                "storage's own tools (e.g. `aws s3 mv --recursive`), then run `reprogate registry check "
                "--repair` again to rebuild it from the records."
            )
        dest = Path(self.uri) / ".damaged" / f"{name}-{stamp}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        Path(self.path(name)).rename(dest)
        return str(dest)

    def versions(self) -> dict[str, int | None]:
        return {name: (t.version() if (t := self.table(name)) else None) for name in TABLES}

    def merge(self, name: str, source: pa.Table, update: list[str] | None = None) -> int:
        """Insert the rows of `source` whose key the table lacks (and, with `update`, set those
        columns where the source holds an older commit); the number of rows inserted."""
        if source.num_rows == 0:
            return 0
        key = TABLES[name].key
        on = " AND ".join(f't."{k}" = s."{k}"' for k in key)
        for attempt in range(RETRIES):
            merger = self.ensure(name).merge(source, predicate=on, source_alias="s", target_alias="t")
            if update:
                merger = merger.when_matched_update(
                    updates={c: f's."{c}"' for c in update},
                    predicate=OLDER_COMMIT,
                )
            try:
                return merger.when_not_matched_insert_all().execute()["num_target_rows_inserted"]
            except CommitFailedError:
                time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))  # another sync committed first
            except (DeltaError, OSError) as e:
                raise self._unreachable(e) from None
        raise UserError(
            f"registry: {self.path(name)}: {RETRIES} commits in a row lost to concurrent writers; "
            "nothing of this table's rows was lost or doubled: run the same sync again."
        )

    def optimize(self) -> dict[str, dict[str, int]]:
        """Compact each table's small files (one per sync) into few, then remove files no
        version younger than VACUUM_HOURS reads. Neither changes a row or the protocol."""
        out = {}
        for name in TABLES:
            table = self.ensure(name)
            compacted = table.optimize.compact()
            removed = table.vacuum(retention_hours=VACUUM_HOURS, dry_run=False)
            out[name] = {
                "files_added": compacted["numFilesAdded"],
                "files_removed": compacted["numFilesRemoved"],
                "vacuumed": len(removed),
            }
        return out

    def _unreachable(self, e: Exception) -> UserError:
        return UserError(
            f"registry: {self.uri} cannot be read or written ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "check params.yaml's `registry:` (a folder, or an s3://, gs://, abfss:// URI with its "
            "credentials in the environment, e.g. AWS_ACCESS_KEY_ID and AWS_REGION). A run is "
            "listed in `runs` only once all its rows are in, so the next sync finishes this one."
        )
