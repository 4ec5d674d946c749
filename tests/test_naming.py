import pytest

from dist_logging import Timestamp, format_name_with_dist, format_name_with_dist_and_time
from dist_logging.naming import check_rank_distinct, template_placeholders, validate_object_name


def test_fills_dist_placeholders(fake_rank):
    fake_rank(rank=5, world_size=8, local_world_size=4)
    name = format_name_with_dist(
        '{run_name}/r{rank}-l{local_rank}-w{world_size}-lw{local_world_size}-n{node_rank}', 'exp'
    )
    assert name == 'exp/r5-l1-w8-lw4-n1'


def test_single_process_defaults():
    assert format_name_with_dist('{run_name}/logs-rank{rank}.txt', 'run1') == 'run1/logs-rank0.txt'


def test_format_spec_and_extra(fake_rank):
    fake_rank(rank=3, world_size=4)
    assert format_name_with_dist('{rank:03d}-{tag}', 'r', tag='best') == '003-best'


def test_unknown_placeholder_names_it_and_lists_allowed():
    with pytest.raises(ValueError) as info:
        format_name_with_dist('{run_name}/{rnak}.txt', 'r')
    message = str(info.value)
    assert '{rnak}' in message and '{rank}' in message and '{node_rank}' in message


@pytest.mark.parametrize('template', ['{rank', 'rank}', '{rank}}x{'])
def test_unbalanced_braces(template):
    with pytest.raises(ValueError, match='template'):
        format_name_with_dist(template, 'r')


def test_positional_placeholder_rejected():
    with pytest.raises(ValueError, match='positional'):
        format_name_with_dist('{}-x', 'r')


def test_empty_result_rejected():
    with pytest.raises(ValueError, match='empty'):
        format_name_with_dist('{tag}', 'r', tag='')


def test_non_string_template():
    with pytest.raises(TypeError):
        format_name_with_dist(42, 'r')


def test_with_time_fields():
    ts = Timestamp(epoch=2, batch=7, batch_in_epoch=3, sample=70, token=700, total_wct=1.5)
    name = format_name_with_dist_and_time(
        '{run_name}/ep{epoch}-ba{batch}-bie{batch_in_epoch}-s{sample}-t{token}', 'r', ts
    )
    assert name == 'r/ep2-ba7-bie3-s70-t700'
    assert format_name_with_dist_and_time('{total_wct:.1f}', 'r', ts) == '1.5'


def test_time_fields_not_allowed_without_timestamp():
    with pytest.raises(ValueError, match='epoch'):
        format_name_with_dist('{epoch}', 'r')


def test_placeholders_parsed():
    assert template_placeholders('{run_name}/{rank:03d}/{x.y}') == {'run_name', 'rank', 'x'}


@pytest.mark.parametrize('name', ['/abs/x', '../up', 'a/../b', '', 'a\x00b', '\\\\server\\x'])
def test_bad_object_names(name):
    with pytest.raises(ValueError):
        validate_object_name(name)


def test_good_object_name():
    assert validate_object_name('run/ckpt/ep1-rank0.pt') == 'run/ckpt/ep1-rank0.pt'


def test_rank_distinct_all(fake_rank):
    fake_rank(rank=0, world_size=2)
    with pytest.raises(ValueError, match="'{run_name}/log.txt'"):
        check_rank_distinct('{run_name}/log.txt', 'all', 'FileLogger filename')
    check_rank_distinct('{run_name}/log{rank}.txt', 'all', 'x')
    check_rank_distinct('{node_rank}-{local_rank}', 'all', 'x')
    check_rank_distinct('{run_name}/log.txt', 'zero', 'x')


def test_rank_distinct_local_zero(fake_rank):
    fake_rank(rank=0, world_size=4, local_world_size=2)
    with pytest.raises(ValueError, match='nodes'):
        check_rank_distinct('{local_rank}.txt', 'local_zero', 'x')
    check_rank_distinct('{node_rank}.txt', 'local_zero', 'x')
    fake_rank(rank=0, world_size=2, local_world_size=2)  # one node: fine
    check_rank_distinct('{local_rank}.txt', 'local_zero', 'x')


def test_single_rank_world_needs_no_rank_placeholder():
    check_rank_distinct('log.txt', 'all', 'x')
