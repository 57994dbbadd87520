"""The harness's rule for telling a crash of umockdev-run from a product failure."""

import signal

from scenarios.world import _umockdev_crash


def _files(tmp_path, out="", err=""):
    (tmp_path / "o").write_text(out)
    (tmp_path / "e").write_text(err)
    return tmp_path / "o", tmp_path / "e"


def test_a_silent_instant_sigsegv_without_calls_is_the_test_bed(tmp_path):
    assert _umockdev_crash(-signal.SIGSEGV, 0.02, *_files(tmp_path), calls=0)


def test_a_product_that_ran_is_never_retried(tmp_path):
    assert not _umockdev_crash(-signal.SIGSEGV, 0.02, *_files(tmp_path, err="podvm-gpu: x"), calls=0)
    assert not _umockdev_crash(-signal.SIGSEGV, 0.02, *_files(tmp_path), calls=1)
    assert not _umockdev_crash(-signal.SIGSEGV, 2.0, *_files(tmp_path), calls=0)
    assert not _umockdev_crash(1, 0.02, *_files(tmp_path), calls=0)
