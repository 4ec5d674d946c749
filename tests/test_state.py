import pytest

from dist_logging import State, Timestamp


def test_keyword_construction_defaults_zero():
    ts = Timestamp(epoch=2, batch=7)
    assert (ts.epoch, ts.batch, ts.sample, ts.token, ts.total_wct) == (2, 7, 0, 0, 0.0)


def test_negative_rejected():
    with pytest.raises(ValueError, match='batch'):
        Timestamp(batch=-1)


def test_non_number_rejected():
    with pytest.raises(TypeError, match='epoch'):
        Timestamp(epoch='1')


def test_state_advances():
    state = State('r')
    state.advance_batch(samples=8, tokens=80)
    state.advance_batch(samples=8, tokens=80)
    state.advance_epoch()
    state.advance_batch(samples=4)
    ts = state.timestamp
    assert (ts.epoch, ts.batch, ts.batch_in_epoch, ts.sample, ts.sample_in_epoch, ts.token, ts.token_in_epoch) == \
        (1, 3, 1, 20, 4, 160, 0)
    assert ts.total_wct >= ts.epoch_wct >= 0 and ts.batch_wct >= 0


def test_bad_advance():
    with pytest.raises(ValueError, match='samples'):
        State('r').advance_batch(samples=-3)
