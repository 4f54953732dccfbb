"""te_grad.collector: builds collect only the young generations, and put the thresholds back."""
import gc
import threading

import numpy as np
import pytest

import te_grad as tg
from te_grad import collector, train


@pytest.fixture
def thresholds():
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


def test_full_collections_wait_inside_and_the_thresholds_come_back(thresholds):
    gc.set_threshold(700, 10, 10)
    with collector.young_only():
        assert gc.get_threshold() == (700, 10, collector.PAUSED)
        with collector.young_only():  # nested: one pause
            assert gc.get_threshold() == (700, 10, collector.PAUSED)
        assert gc.get_threshold() == (700, 10, collector.PAUSED)
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(ZeroDivisionError):
        with collector.young_only():
            1 / 0
    assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_set_during_a_build_and_a_collector_switched_off_are_kept(thresholds):
    gc.set_threshold(700, 10, 10)
    with collector.young_only():
        gc.set_threshold(2000, 50, 50)
    assert gc.get_threshold() == (2000, 50, 50)
    gc.set_threshold(0, 10, 10)
    with collector.young_only():
        assert gc.get_threshold() == (0, 10, 10)
        gc.set_threshold(0, 20, 20)
    assert gc.get_threshold() == (0, 20, 20)


def test_concurrent_builds_share_one_pause(thresholds):
    gc.set_threshold(500, 7, 9)
    inside, release = threading.Event(), threading.Event()

    def other():
        with collector.young_only():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert inside.wait(10)
        with collector.young_only():
            assert gc.get_threshold() == (500, 7, collector.PAUSED)
        assert gc.get_threshold() == (500, 7, collector.PAUSED)  # the other build still runs
    finally:
        release.set()
        t.join()
    assert gc.get_threshold() == (500, 7, 9)


def test_a_long_pause_lets_one_full_collection_through_when_a_build_starts(thresholds, monkeypatch):
    full = []

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            full.append(1)
    gc.set_threshold(700, 10, 10)
    gc.callbacks.append(seen)
    try:
        with collector.young_only():
            with collector.young_only():
                assert not full
            monkeypatch.setattr(collector, "MAX_PAUSE_S", -1.0)
            with collector.young_only():
                assert len(full) == 1
            assert gc.get_threshold() == (700, 10, collector.PAUSED)
    finally:
        gc.callbacks.remove(seen)
    assert gc.get_threshold() == (700, 10, 10)


def _spy(monkeypatch, module, name, seen):
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        seen.setdefault(name, []).append(gc.get_threshold()[2])
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, wrapped)


def test_gradient_simplification_and_build_run_with_full_collections_paused(thresholds, monkeypatch):
    import codegen
    import simplify
    seen = {}
    gc.set_threshold(700, 10, 10)
    X = tg.placeholder((4, 5), name="X")
    k = tg.reduce_axis(5, "k")
    Y = tg.compute((4,), lambda i: tg.sum(tg.exp(X[i, k]) * 0.375, axis=k), name="Y_collector")
    _spy(monkeypatch, simplify, "simplify_graph", seen)
    dX, = tg.gradient(Y, [X])
    assert seen["simplify_graph"] and set(seen["simplify_graph"]) == {collector.PAUSED}
    _spy(monkeypatch, codegen, "stages_for", seen)
    kern = tg.build([Y, dX], [X], disk_cache=False)
    assert seen["stages_for"] == [collector.PAUSED]
    assert gc.get_threshold() == (700, 10, 10)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    y, dx = kern(x)
    np.testing.assert_allclose(y, 0.375 * np.exp(x).sum(1), rtol=1e-5)
    np.testing.assert_allclose(dx, 0.375 * np.exp(x), rtol=1e-5)


def test_the_trainers_step_build_and_an_import_run_with_full_collections_paused(thresholds, monkeypatch):
    gc.set_threshold(700, 10, 10)
    seen = []

    def loss(out, y):  # called while the Trainer builds its step, before any gradient
        seen.append(gc.get_threshold()[2])
        return tg.nn.mse_loss(out, y)
    x, y = tg.placeholder((4, 3), name="x"), tg.placeholder((4, 2), name="y")
    trainer = train.Trainer(train.Linear(3, 2), inputs=[x], targets=[y], loss=loss, optimizer=train.SGD(lr=0.1),
                            progress=False)
    trainer.compile()
    assert seen and set(seen) == {collector.PAUSED}
    assert gc.get_threshold() == (700, 10, 10)

    torch = pytest.importorskip("torch")
    import te_grad.torch as tgt
    exported = {}
    _spy(monkeypatch, torch.export, "export", exported)
    tgt.import_model(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    assert exported["export"] and set(exported["export"]) == {collector.PAUSED}
    assert gc.get_threshold() == (700, 10, 10)
