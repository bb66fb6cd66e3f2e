"""etcd's gRPC stubs (lockserver/etcd_proto/) are exactly what `make etcd-stubs` makes from
etcd's own .proto files in third_party/etcd/: regenerated here into a temporary directory and
compared byte for byte, so they are never edited by hand and never stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "lockserver" / "etcd_proto"


def test_the_committed_stubs_are_what_the_script_makes_from_etcds_protos(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "etcd_stubs.py"), "--out", str(tmp_path)],
        check=True,
        cwd=ROOT,
    )
    made = {p.name: p.read_bytes() for p in (tmp_path / "lockserver" / "etcd_proto").iterdir()}
    committed = {p.name: p.read_bytes() for p in GENERATED.iterdir() if p.is_file()}
    assert sorted(made) == sorted(committed)
    for name, content in made.items():
        assert committed[name] == content, f"{name} differs from what make etcd-stubs makes"


def test_the_stripped_protos_keep_no_annotation_protoc_for_python_cannot_resolve():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import etcd_stubs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for source in etcd_stubs.PROTOS:
        original = (etcd_stubs.SOURCE / source).read_text()
        stripped = etcd_stubs.strip(original)
        for annotation in ("gogoproto", "google.api", "openapiv2", "versionpb"):
            assert annotation not in stripped, (source, annotation)
        # every message and rpc of etcd's file is still there
        for word in ("message ", "rpc ", "enum "):
            assert stripped.count(word) == original.count(word), (source, word)
