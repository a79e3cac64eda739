"""executor=fit's calls of Model.fit (runner.executors.fit._fit_calls): one, or for a Keras 3 model resumed inside an
epoch (Keras 3 has no hook to start there) that epoch's remaining steps first. End to end: tests/e2e/test_keras3.py."""

from runner.executors.fit import _fit_calls


def test_one_call_from_the_start_at_an_epoch_boundary_or_where_fit_resumes_inside_an_epoch():
    assert _fit_calls(0, 8, 2, inside_epoch=False) == [(0, 2, 8, 0)]
    assert _fit_calls(8, 8, 2, inside_epoch=False) == [(1, 2, 8, 8)]
    assert _fit_calls(12, 8, 2, inside_epoch=True) == [(1, 2, 8, 12)]  # tf_keras: ResumeInsideEpoch


def test_keras3_resumed_inside_an_epoch_finishes_it_first_then_the_following_epochs():
    assert _fit_calls(12, 8, 3, inside_epoch=False) == [(1, 2, 4, 12), (2, 3, 8, 16)]
    assert _fit_calls(12, 8, 2, inside_epoch=False) == [(1, 2, 4, 12)]  # its last epoch: nothing after it
