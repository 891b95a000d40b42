"""Reading a sharded checkpoint from a store: each process downloads only what its load reads.

A local copy of a checkpoint in a store (`verify.verified`) holds every file but a sharded (DCP)
checkpoint's shard files. DCP's reader (`elastic.safe_reader`) asks, before it reads, for the
byte ranges its load plan needs of each file::

    moved = fetch_missing("/tmp/fitkit-staging/.../download/checkpoint-8",
                          {"state.pt/__0_0.distcp": [(0, 1577), ...], "state.pt/__1_0.distcp": [(0, 1261)]})
    # __0_0.distcp downloaded whole (digest checked); of __1_0.distcp only those records, each
    # checked against its digest in the manifest's `pieces`: moved == {"state.pt/__1_0.distcp": "<a file of this process's>"}
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

from fitkit.engine.checkpoint import store
from fitkit.engine.checkpoint.layout import FIX_DAMAGED, CheckpointError
from fitkit.engine.checkpoint.listing import confined, read_manifest


def fetch_missing(path: str, wanted: dict[str, list[tuple[int, int]]]) -> dict[str, str]:
    """Download into the local copy `path` of a checkpoint in a store (`verify.verified`) what this
    process's load reads of the files it does not hold yet (a sharded checkpoint's shards):
    `wanted` names each file (relative to `path`) with the `(offset, length)` byte ranges read.
    A file is downloaded whole and checked against the manifest's size and digest, unless only
    some of its records are read and each has a digest of its own in the manifest (`pieces`:
    the values DCP writes once for every process): those ranges alone are read, each checked,
    into a file of this process's own, returned by name (`{name: local file}`; remove it after
    the read). A CheckpointError names the checkpoint's URL and the file that differs. A path
    that is no such copy is left as it is."""
    url = store.origin(path)
    if url is None:
        return {}
    missing = [n for n in wanted if not os.path.isfile(confined(path, n))]
    if not missing:
        return {}
    manifest = read_manifest(path)
    parent, name = store.split(url)
    where = store.Store.open(parent, "`resume_from_checkpoint`", check=False)

    def corrupted(rel: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {url!r} is corrupted: {rel} differs from the size and {manifest['digest']} "
                               f"digest recorded when it was written; {FIX_DAMAGED}")

    def whole(rel: str) -> None:
        target = confined(path, rel)
        part = f"{target}.part-{os.getpid()}"  # processes sharing this copy may need the same file
        where.download(f"{name}/{rel}", part)
        if os.path.getsize(part) != manifest["files"].get(rel) or \
                _file_digest(part, manifest["digest"]) != manifest["digests"].get(rel):
            os.remove(part)
            raise corrupted(rel)
        os.replace(part, target)

    def ranges(rel: str) -> str:
        pieces, own = manifest.get("pieces", {}).get(rel, {}), f"{confined(path, rel)}.pieces-{os.getpid()}"
        with open(own, "wb") as f:
            for offset, length in sorted(set(wanted[rel])):
                data = where.read_range(f"{name}/{rel}", offset, length)
                if hashlib.new(manifest["digest"], data).hexdigest() != pieces[f"{offset}+{length}"]:
                    raise corrupted(rel)
                f.seek(offset)
                f.write(data)
        return own

    def partial(rel: str) -> bool:
        pieces = manifest.get("pieces", {}).get(rel, {})
        return isinstance(pieces, dict) and all(f"{o}+{n}" in pieces for o, n in wanted[rel]) and \
            len(set(wanted[rel])) < len(pieces)

    by_range = [rel for rel in missing if partial(rel)]
    with ThreadPoolExecutor(max_workers=max(1, min(len(missing), 8))) as pool:
        list(pool.map(whole, [rel for rel in missing if rel not in by_range]))
        return dict(zip(by_range, pool.map(ranges, by_range)))


def _file_digest(path: str, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
