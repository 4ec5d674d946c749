"""FileLogger: the text / JSON Lines log, flushing, uploads at flush, tables (JSONL/CSV) and images (PNG)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch
from recording_uploader import UPLOADS_AT_CLOSE_BUG, RecordingUploader, logger_refuses_uploads_at_close

from dist_logging import Logger
from dist_logging.destinations import FileLogger

pytestmark = pytest.mark.timeout(60)


def _read_png(data: bytes) -> np.ndarray:
    import matplotlib.image

    return (matplotlib.image.imread(io.BytesIO(data), format='png') * 255 + 0.5).astype(np.uint8)


def test_text_log_in_composers_line_format(tmp_path):
    destination = FileLogger(str(tmp_path / '{run_name}' / 'log-rank{rank}.txt'), buffer_size=1)
    with Logger(destination, run_name='t') as logger:
        logger.log_hyperparameters({'foo': 3})
        logger.log_metrics({'loss': 2}, step=1)
        logger.log_table(columns=['prompt', 'generation'], rows=[['p0', 'g0'], ['p1', 'g1']], name='test_table')
        logger.log_traces({'note': 'hi'})
        logger.batch_end()
        logger.log_metrics({'acc': 0.5, 'f1': 0.25})
    with open(tmp_path / 't' / 'log-rank0.txt') as f:
        assert f.readlines() == [
            '[hyperparameter]: foo: 3 \n',
            '[metric][batch=1]: loss: 2 \n',
            '[table]: test_table: {"columns":["prompt","generation"],"data":[["p0","g0"],["p1","g1"]]}\n',
            '[trace]: note:hi\n',
            '[metric][batch=1]: acc: 0.5 \n',  # step=None: the batch count
            '[metric][batch=1]: f1: 0.25 \n',
        ]


def test_buffer_size_one_writes_each_line_at_once(tmp_path):
    path = tmp_path / 'log.txt'
    logger = Logger(FileLogger(str(path), buffer_size=1, flush_interval=1000), run_name='b')
    logger.log_metrics({'loss': 1.5}, step=4)
    assert path.read_text() == '[metric][batch=4]: loss: 1.5 \n'  # no flush needed
    logger.close()


@pytest.mark.parametrize('size', [0, -2, 1.5, True, '1'])
def test_bad_buffer_size(tmp_path, size):
    with pytest.raises(ValueError, match='buffer_size'):
        FileLogger(str(tmp_path / 'log.txt'), buffer_size=size)


def test_write_prefixes_each_new_line_and_keeps_text_written_before_open(tmp_path):
    destination = FileLogger(str(tmp_path / 'log.txt'))
    destination.write('[stdout]: ', 'early\n')
    logger = Logger(destination, run_name='w')
    destination.write('[stdout]: ', 'Hello\nExtra')
    destination.write('[stdout]: ', ' line\n\nlast\n')
    logger.log_traces({'multi': 'a\nb'})
    logger.close()
    assert (tmp_path / 'log.txt').read_text().splitlines() == [
        '[stdout]: early',
        '[stdout]: Hello',
        '[stdout]: Extra line',
        '',
        '[stdout]: last',
        '[trace]: multi:a',
        '[trace]: multi:b',
    ]
    with pytest.raises(RuntimeError, match='closed'):
        destination.write('[stdout]: ', 'late\n')


def test_overwrite_truncates_and_default_appends(tmp_path):
    path = tmp_path / 'log.txt'
    for overwrite, expected in ((False, 1), (False, 2), (True, 1)):
        with Logger(FileLogger(str(path), overwrite=overwrite), run_name='o') as logger:
            logger.log_metrics({'loss': 1.0}, step=1)
        assert path.read_text().count('loss') == expected


def test_jsonl_log(tmp_path):
    destination = FileLogger(str(tmp_path / 'log.jsonl'), format='jsonl')
    with Logger(destination, run_name='j') as logger:
        logger.log_metrics({'loss': float('nan'), 'acc': 1}, step=2)
    (record,) = [json.loads(line) for line in (tmp_path / 'log.jsonl').read_text().splitlines()]
    assert record['kind'] == 'metric' and record['step'] == 2 and record['data']['acc'] == 1
    assert record['data']['loss'] != record['data']['loss']  # NaN survives


def test_flush_interval(tmp_path):
    # Lines reach the OS at every batch end (issue 21: a killed rank keeps them); uploads wait for the interval.
    path = tmp_path / 'log.txt'
    uploader = RecordingUploader()
    logger = Logger([FileLogger(str(path), remote_file_name='f/log.txt', flush_interval=3), uploader], run_name='f')
    logger.log_metrics({'loss': 1.0})
    assert path.read_text() == ''  # buffered until the batch ends
    logger.batch_end()
    assert 'loss: 1.0' in path.read_text()
    logger.batch_end()
    assert uploader.names() == []  # uploaded at batch 3
    logger.batch_end()
    assert uploader.names() == ['f/log.txt']
    logger.log_metrics({'loss': 2.0})
    logger.epoch_end()  # epoch end always flushes
    assert 'loss: 2.0' in path.read_text() and uploader.names() == ['f/log.txt'] * 2
    logger.close()


def test_uploads_log_at_each_flush_with_newest_bytes(tmp_path):
    uploader = RecordingUploader()
    destination = FileLogger(
        str(tmp_path / 'local-{rank}.txt'), remote_file_name='{run_name}/logs/rank{rank}.txt', flush_interval=1
    )
    logger = Logger([destination, uploader], run_name='u')
    logger.log_metrics({'loss': 1.0}, step=1)
    logger.batch_end()
    logger.batch_end()  # nothing new: no second upload
    logger.log_metrics({'loss': 2.0}, step=2)
    logger.batch_end()
    assert uploader.names() == ['u/logs/rank0.txt', 'u/logs/rank0.txt']
    assert all(overwrite for _, _, overwrite in uploader.uploads)
    assert b'loss: 1.0' in uploader.uploads[0][1] and b'loss: 2.0' not in uploader.uploads[0][1]
    assert uploader.objects['u/logs/rank0.txt'] == (tmp_path / 'local-0.txt').read_bytes()
    logger.close()


@pytest.mark.xfail(logger_refuses_uploads_at_close(), reason=UPLOADS_AT_CLOSE_BUG, strict=True)
def test_uploads_pending_lines_at_close(tmp_path):
    uploader = RecordingUploader()
    destination = FileLogger(str(tmp_path / 'log.txt'), remote_file_name='logs/{run_name}.txt')
    logger = Logger([destination, uploader], run_name='c')
    logger.log_metrics({'loss': 3.0}, step=1)
    logger.close()
    assert uploader.objects['logs/c.txt'] == (tmp_path / 'log.txt').read_bytes()


def test_no_upload_without_remote_name(tmp_path):
    uploader = RecordingUploader()
    logger = Logger(
        [FileLogger(str(tmp_path / 'log.txt'), remote_file_name='', flush_interval=1), uploader], run_name='n'
    )
    logger.log_metrics({'loss': 1.0})
    logger.batch_end()
    logger.close()
    assert uploader.uploads == []


def test_tables_as_jsonl(tmp_path):
    uploader = RecordingUploader()
    destination = FileLogger(
        str(tmp_path / 'run' / 'log-{rank}.txt'), remote_file_name='r/log-{rank}.txt', flush_interval=1
    )
    logger = Logger([destination, uploader], run_name='tj')
    logger.log_table(
        ['name', 'score', 'vec'],
        [['a', np.float32(0.5), torch.tensor([1, 2])], ['b', 2, None]],
        name='eval/results',
        step=4,
    )
    logger.log_table(['name', 'score', 'vec'], [['c', float('inf'), []]], name='eval/results', step=5)
    logger.batch_end()
    table = tmp_path / 'run' / 'log-0' / 'tables' / 'eval' / 'results.jsonl'
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    assert rows == [
        {'_step': 4, 'name': 'a', 'score': 0.5, 'vec': [1, 2]},
        {'_step': 4, 'name': 'b', 'score': 2, 'vec': None},
        {'_step': 5, 'name': 'c', 'score': 'inf', 'vec': []},
    ]
    assert uploader.objects['r/log-0/tables/eval/results.jsonl'] == table.read_bytes()
    assert 'eval/results' in (tmp_path / 'run' / 'log-0.txt').read_text()  # the log names the table file
    logger.close()


def test_tables_as_csv_keep_one_header(tmp_path):
    destination = FileLogger(str(tmp_path / 'log.txt'), table_format='csv')
    logger = Logger(destination, run_name='tc')
    logger.log_table(['a', 'b'], [[1, 'x,y'], [2, 'z']], name='t', step=1)
    logger.log_table(['a', 'b'], [[3, 'w']], name='t', step=2)
    with pytest.warns(RuntimeWarning, match='columns'):
        logger.log_table(['a', 'c'], [[4, 'v']], name='t', step=3)  # recorded, re-raised at close
    with pytest.raises(ValueError, match='keeps one header'):
        logger.close()
    with open(tmp_path / 'log' / 'tables' / 't.csv', newline='') as f:
        assert list(csv.reader(f)) == [['_step', 'a', 'b'], ['1', '1', 'x,y'], ['1', '2', 'z'], ['2', '3', 'w']]


@pytest.mark.parametrize(
    'make, channels_last, expected_shape',
    [
        (lambda: np.random.randint(0, 256, (3, 4, 5), dtype=np.uint8), False, (1, 4, 5, 3)),  # CHW uint8
        (lambda: np.random.rand(4, 5, 3).astype(np.float32), True, (1, 4, 5, 3)),  # HWC float
        (lambda: torch.rand(2, 1, 4, 5), False, (2, 4, 5, 1)),  # NCHW tensor
        (lambda: [np.random.rand(4, 5, 4), np.random.rand(4, 5, 4)], True, (2, 4, 5, 4)),  # list of HWC RGBA
        (lambda: np.random.rand(4, 5) > 0.5, False, (1, 4, 5, 1)),  # HW bool
    ],
)
def test_images_as_png(tmp_path, make, channels_last, expected_shape):
    from dist_logging._images import to_image_batch, to_uint8

    uploader = RecordingUploader()
    images = make()
    destination = FileLogger(str(tmp_path / 'log.txt'), remote_file_name='remote/log.txt')
    with Logger([destination, uploader], run_name='img') as logger:
        logger.log_images(images, name='samples', channels_last=channels_last, step=7)
        logger.epoch_end()
    expected = to_uint8(to_image_batch(images, channels_last))
    assert expected.shape == expected_shape
    for index in range(expected_shape[0]):
        path = tmp_path / 'log' / 'images' / 'samples' / f'step000007-{index}.png'
        decoded = _read_png(path.read_bytes())
        assert np.array_equal(decoded.reshape(expected[index].shape), expected[index])
        assert uploader.objects[f'remote/log/images/samples/step000007-{index}.png'] == path.read_bytes()


def test_images_with_masks_and_repeated_step(tmp_path):
    destination = FileLogger(str(tmp_path / 'log.txt'))
    images = np.full((2, 3, 4, 4), 0.5, dtype=np.float32)
    masks = {'truth': np.zeros((2, 4, 4), dtype=np.int64)}
    masks['truth'][0, 0, 0] = 1
    with Logger(destination, run_name='m') as logger:
        logger.log_images(images, name='seg', step=1, masks=masks)
        logger.log_images(images, name='seg', step=1)  # same name and step: kept, not overwritten
    folder = tmp_path / 'log' / 'images' / 'seg'
    assert sorted(p.name for p in folder.iterdir()) == [
        'step000001-0.png',
        'step000001-0.truth.png',
        'step000001-1.png',
        'step000001-1.truth.png',
        'step000001_2-0.png',
        'step000001_2-1.png',
    ]
    overlaid = _read_png((folder / 'step000001-0.truth.png').read_bytes())
    plain = _read_png((folder / 'step000001-0.png').read_bytes())
    assert not np.array_equal(overlaid[0, 0], plain[0, 0]) and np.array_equal(overlaid[1, 1], plain[1, 1])


@pytest.mark.parametrize(
    'images, message',
    [
        (np.zeros((2, 5, 8, 8)), '1, 3 or 4 channels'),
        (np.full((8, 8, 3), 256, dtype=np.int32), 'values 0-255'),  # other integer types: 0-255 only
        (np.zeros((1, 1, 2, 3, 4, 4)), 'expected an image'),
        ('not an image', 'numpy array or a torch tensor'),
    ],
)
def test_bad_images_raise_value_error_at_the_call(tmp_path, images, message):
    with Logger(FileLogger(str(tmp_path / 'log.txt')), run_name='bad') as logger:
        with pytest.raises(ValueError, match=message):
            logger.log_images(images, channels_last=isinstance(images, np.ndarray) and images.shape[-1] == 3)


def test_mask_shape_mismatch_names_the_expected_shape(tmp_path):
    from dist_logging._images import to_image_batch, validate_masks

    batch = to_image_batch(np.zeros((2, 3, 4, 4), np.float32))
    with pytest.raises(ValueError, match=r'expected class ids of shape \(2, 4, 4\)'):
        validate_masks({'pred': np.zeros((2, 5, 4), np.int64)}, batch)
    with pytest.raises(ValueError, match='integer class ids'):
        validate_masks({'pred': np.zeros((2, 4, 4), np.float32)}, batch)


def test_restart_appends(tmp_path):
    for value in (1.0, 2.0):
        with Logger(FileLogger(str(tmp_path / 'log.txt')), run_name='again') as logger:
            logger.log_metrics({'loss': value})
    assert (tmp_path / 'log.txt').read_text().count('loss') == 2


def test_validates_at_construction(fake_rank):
    with pytest.raises(ValueError, match='format'):
        FileLogger(format='yaml')
    with pytest.raises(ValueError, match='table_format'):
        FileLogger(table_format='parquet')
    with pytest.raises(ValueError, match='flush_interval'):
        FileLogger(flush_interval=0)
    fake_rank(rank=0, world_size=2)
    with pytest.raises(ValueError, match='cannot tell ranks apart'):
        FileLogger(filename='{run_name}/log.txt')


def test_png_encoder_round_trip():
    from dist_logging._images import encode_png

    for channels in (1, 3, 4):
        image = np.random.randint(0, 256, (6, 9, channels), dtype=np.uint8)
        assert np.array_equal(_read_png(encode_png(image)).reshape(image.shape), image)
    with pytest.raises(ValueError, match='HWC uint8'):
        encode_png(np.zeros((4, 4, 2), np.uint8))


def test_bfloat16_images_written_as_png(tmp_path):
    destination = FileLogger(str(tmp_path / 'log.txt'))
    with Logger(destination, run_name='bf') as logger:
        logger.log_images(torch.ones(1, 3, 2, 2, dtype=torch.bfloat16), name='white', step=1)
    (png,) = (tmp_path / 'log' / 'images' / 'white').glob('*.png')
    assert (_read_png(png.read_bytes()) == 255).all()


# ---------------------------------------------------------------------------- capture_stdout / capture_stderr
def test_capture_stdout_and_stderr_copy_each_line_and_still_print(tmp_path, capsys):
    import sys

    real_out, real_err = sys.stdout, sys.stderr
    destination = FileLogger(str(tmp_path / 'log-rank{rank}.txt'), capture_stdout=True, capture_stderr=True)
    with Logger(destination, run_name='cap') as logger:
        assert sys.stdout is not real_out and sys.stdout.encoding == real_out.encoding
        print('hello', 'world')
        print('two\nlines', file=sys.stderr)
        logger.log_metrics({'loss': 0.5}, step=1)
        sys.stdout.write('unfinished')  # written to the log at close
    assert sys.stdout is real_out and sys.stderr is real_err
    print('after close')
    captured = capsys.readouterr()
    assert captured.out == 'hello world\nunfinishedafter close\n' and captured.err == 'two\nlines\n'
    assert (tmp_path / 'log-rank0.txt').read_text().splitlines() == [
        '[stdout]: hello world',
        '[stderr]: two',
        '[stderr]: lines',
        '[metric][batch=1]: loss: 0.5 ',
        '[stdout]: unfinished',
    ]


def test_capture_starts_at_construction_as_in_composer(tmp_path, capsys):
    """What is printed between building the FileLogger and building the Logger reaches the log, first."""
    import sys

    real_out = sys.stdout
    destination = FileLogger(str(tmp_path / 'log.txt'), capture_stdout=True, capture_stderr=True)
    assert sys.stdout is not real_out
    print('before the Logger')
    print('warned early', file=sys.stderr)
    with Logger(destination, run_name='early') as logger:
        print('inside')
        logger.log_metrics({'loss': 1.0}, step=1)
    assert sys.stdout is real_out
    capsys.readouterr()
    assert (tmp_path / 'log.txt').read_text().splitlines() == [
        '[stdout]: before the Logger',
        '[stderr]: warned early',
        '[stdout]: inside',
        '[metric][batch=1]: loss: 1.0 ',
    ]

    jsonl = FileLogger(str(tmp_path / 'log.jsonl'), format='jsonl', capture_stdout=True)
    print('early json')
    with Logger(jsonl, run_name='early'):
        pass
    capsys.readouterr()
    records = [json.loads(line) for line in (tmp_path / 'log.jsonl').read_text().splitlines()]
    assert [(r['kind'], r['data']) for r in records] == [('stdout', 'early json')]


def test_a_capturing_file_logger_dropped_unclosed_stops_capturing(tmp_path, capsys):
    import gc
    import sys

    real_out = sys.stdout
    destination = FileLogger(str(tmp_path / 'never-opened.txt'), capture_stdout=True)
    assert sys.stdout is not real_out
    del destination
    gc.collect()
    assert sys.stdout is real_out  # the tee is gone with it
    print('after')
    assert capsys.readouterr().out == 'after\n'


def test_early_text_is_bounded_and_the_rest_counted(tmp_path, monkeypatch):
    from dist_logging.destinations import file as file_module

    monkeypatch.setattr(file_module, '_EARLY_TEXT_LIMIT', 10)
    destination = FileLogger(str(tmp_path / 'log.txt'))
    destination.write('[x]: ', 'kept\n')  # 10 characters with the prefix
    destination.write('[x]: ', 'not kept\n')
    with Logger(destination, run_name='bounded'):
        pass
    assert (tmp_path / 'log.txt').read_text().splitlines() == [
        '[x]: kept',
        '[notice]: 14 characters written before the Logger opened this log were not kept (more than 10 waited)',
    ]


def test_capture_stdout_jsonl_records_carry_the_time(tmp_path, capsys):
    destination = FileLogger(str(tmp_path / 'log.jsonl'), format='jsonl', capture_stdout=True)
    with Logger(destination, run_name='cj'):
        print('as json')
    capsys.readouterr()
    (record,) = [json.loads(line) for line in (tmp_path / 'log.jsonl').read_text().splitlines()]
    assert record['kind'] == 'stdout' and record['data'] == 'as json' and record['time'] > 1.6e9


def test_capture_is_off_by_default_and_only_where_the_logger_opens_the_file(tmp_path, capsys, fake_rank):
    import sys

    real_out = sys.stdout
    with Logger(FileLogger(str(tmp_path / 'a-rank{rank}.txt')), run_name='off'):
        assert sys.stdout is real_out
    fake_rank(1, 2)
    with Logger(FileLogger(str(tmp_path / 'b.txt'), ranks='zero', capture_stdout=True), run_name='off'):
        assert sys.stdout is real_out  # rank 1: this FileLogger is not opened here, so nothing is captured
    assert sys.stdout is real_out
    FileLogger(str(tmp_path / 'c.txt'), ranks='zero', capture_stdout=True)
    assert sys.stdout is real_out  # nor from its constructor


def test_capture_leaves_a_later_wrapper_in_place(tmp_path, capsys):
    import sys

    destination = FileLogger(str(tmp_path / 'log.txt'), capture_stdout=True)
    logger = Logger(destination, run_name='wrap')
    tee = sys.stdout
    wrapper = io.TextIOWrapper(io.BytesIO(), write_through=True)  # stands for someone else's redirection
    sys.stdout = wrapper
    try:
        logger.close()
        assert sys.stdout is wrapper  # not undone under their feet
        tee.write('passes through, not copied\n')
    finally:
        sys.stdout = tee.stream
    assert 'passes through' in capsys.readouterr().out
    assert 'passes through' not in (tmp_path / 'log.txt').read_text()


def test_capture_failure_is_reported_at_the_next_flush(tmp_path, capsys):
    class FullDisk(io.StringIO):
        def write(self, text):
            raise OSError(28, 'No space left on device')

    destination = FileLogger(str(tmp_path / 'log.txt'), capture_stdout=True)
    logger = Logger(destination, run_name='full')
    real_file, destination._file = destination._file, FullDisk()
    try:
        print('still printed')
        assert 'still printed' in capsys.readouterr().out
        with pytest.raises(OSError, match='No space left'):
            destination.flush()
        destination.flush()  # reported once
    finally:
        destination._file = real_file
        logger.close()
