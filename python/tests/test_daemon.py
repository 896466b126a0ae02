"""Daemon-wide calls: info, images (import, list, delete), gc."""

from __future__ import annotations

from pathlib import Path

import pytest

import sandtree
from conftest import Daemon


def test_info(client: sandtree.Sandtree, daemon: Daemon) -> None:
    info = client.info()
    assert info.version
    assert info.data_dir == str(daemon.dir)
    assert info.volume.total_bytes > info.volume.free_bytes > 0
    assert info.cgroup in ("v1", "v2")
    assert info.images >= 1


def test_images_import_and_delete(client: sandtree.Sandtree, tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "motd").write_text("tiny\n")
    progress: list[sandtree.ImportProgress] = []
    image = client.import_image("pytest-tiny", str(rootfs), on_progress=progress.append)
    try:
        assert image.name == "pytest-tiny"
        assert image.kind == "imported"
        assert image.source == str(rootfs)
        assert image.size_bytes == len("tiny\n")
        assert progress and progress[-1].done_bytes == progress[-1].total_bytes
        assert {"default", "pytest-tiny"} <= {i.name for i in client.images()}
        with pytest.raises(sandtree.ConflictError) as info:
            client.import_image("pytest-tiny", str(rootfs))
        assert info.value.code == "already_exists"
    finally:
        client.delete_image("pytest-tiny")
    assert "pytest-tiny" not in {i.name for i in client.images()}
    with pytest.raises(sandtree.InvalidArgumentError):
        client.import_image("pytest-none", str(tmp_path / "missing"))


def test_gc(client: sandtree.Sandtree) -> None:
    report = client.gc()
    assert isinstance(report, sandtree.GcReport)
    assert report.duration_ms >= 0
