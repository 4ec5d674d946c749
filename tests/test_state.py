import dataclasses

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
    assert (ts.epoch, ts.batch, ts.batch_in_epoch, ts.sample, ts.sample_in_epoch, ts.token, ts.token_in_epoch) == (
        1,
        3,
        1,
        20,
        4,
        160,
        0,
    )
    assert ts.total_wct >= ts.epoch_wct >= 0 and ts.batch_wct >= 0


def test_bad_advance():
    with pytest.raises(ValueError, match='samples'):
        State('r').advance_batch(samples=-3)


def test_to_next_batch_is_the_same_as_building_it_field_by_field():
    ts = Timestamp(
        epoch=1,
        batch=4,
        batch_in_epoch=2,
        sample=40,
        sample_in_epoch=20,
        token=400,
        token_in_epoch=200,
        total_wct=3.0,
        epoch_wct=1.5,
        batch_wct=0.5,
    )
    following = ts.to_next_batch(samples=10, tokens=100, duration=0.25)
    assert following == Timestamp(
        epoch=1,
        batch=5,
        batch_in_epoch=3,
        sample=50,
        sample_in_epoch=30,
        token=500,
        token_in_epoch=300,
        total_wct=3.25,
        epoch_wct=1.75,
        batch_wct=0.25,
    )
    assert hash(following) == hash(Timestamp(**vars(following))) and type(following) is Timestamp
    with pytest.raises(dataclasses.FrozenInstanceError):
        following.batch = 0
    assert ts.batch == 4  # unchanged


@pytest.mark.parametrize(
    'kwargs, name',
    [
        ({'samples': -1}, 'samples'),
        ({'tokens': 1.5}, 'tokens'),
        ({'samples': True}, 'samples'),
        ({'duration': -0.1}, 'duration'),
        ({'duration': '1'}, 'duration'),
    ],
)
def test_to_next_batch_rejects_bad_increments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Timestamp().to_next_batch(**kwargs)
