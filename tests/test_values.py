import numpy as np
import pytest
import torch

from dist_logging import format_log_data_value
from dist_logging._values import metric_scalar


@pytest.mark.parametrize(
    'value,expected',
    [
        ('text', 'text'),
        (3, '3'),
        (0.5, '0.5'),
        (2.0, '2.0'),
        (True, 'True'),
        (None, 'None'),
        (np.float32(1.5), '1.5'),
        (torch.tensor(2.5), '2.5'),
        (torch.tensor([[1, 2], [3, 4]]), '[[1, 2], [3, 4]]'),
        (np.array([1.5, 2.5]), '[1.5, 2.5]'),
        ({'a': 1, 'b': {'c': [1, 'x']}}, '{ a: 1, b: { c: [1, x] } }'),
        ((1, 2), '[1, 2]'),
    ],
)
def test_format_log_data_value(value, expected):
    assert format_log_data_value(value) == expected


def test_format_unknown_type_never_raises():
    class Thing:
        def __str__(self):
            return 'thing'

    assert format_log_data_value({'t': Thing()}) == '{ t: thing }'


def test_metric_scalar_keeps_nan_and_inf():
    assert metric_scalar('x', float('inf')) == float('inf')
    assert np.isnan(metric_scalar('x', np.float64('nan')))


def test_metric_scalar_rejects_complex():
    with pytest.raises(TypeError, match="'z'"):
        metric_scalar('z', torch.tensor(1 + 2j))
