"""TensorboardLogger against the real tensorboard package, read back with EventAccumulator."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip('tensorboard', reason='tensorboard is not installed: pip install dist-logging[tensorboard]')

from recording_uploader import UPLOADS_AT_CLOSE_BUG, RecordingUploader, logger_refuses_uploads_at_close  # noqa: E402

from dist_logging import Logger  # noqa: E402
from dist_logging.destinations import TensorboardLogger  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _accumulator(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={'scalars': 0, 'images': 0, 'tensors': 0})
    acc.Reload()
    return acc


def test_scalars_hparams_text_tables_images(tmp_path):
    tb = TensorboardLogger(log_dir=str(tmp_path / '{run_name}' / 'tb'), flush_interval=2)
    with Logger(tb, run_name='r1') as logger:
        logger.log_hyperparameters({'lr': 0.1, 'model': {'depth': 4, 'name': 'mlp'}, 'tags': ['a', 'b']})
        for batch in range(1, 6):
            logger.log_metrics({'loss': 1.0 / batch, 'acc': batch * 0.1}, step=batch * 10)
            logger.batch_end()
        logger.log_metrics({'no_step': 7.0})  # step defaults to the batch count (5)
        logger.log_traces({'algo': {'k': 1}})
        logger.log_table(['name', 'score'], [['a', 1], ['b|c', 2.5]], name='results', step=3)
        images = np.random.rand(2, 3, 8, 6).astype(np.float32)  # NCHW float
        masks = {'pred': np.random.randint(0, 3, size=(2, 8, 6))}
        logger.log_images(images, name='samples', step=4, masks=masks, mask_class_labels={1: 'cat', 2: 'dog'})
        logger.log_images(np.zeros((5, 7, 1), np.uint8), name='gray', channels_last=True, step=4)
    acc = _accumulator(tmp_path / 'r1' / 'tb')
    assert [(e.step, e.value) for e in acc.Scalars('loss')] == [(s * 10, pytest.approx(1.0 / s)) for s in range(1, 6)]
    assert [e.step for e in acc.Scalars('acc')] == [10, 20, 30, 40, 50]
    assert [(e.step, e.value) for e in acc.Scalars('no_step')] == [(5, 7.0)]

    # hparams plugin: written to the same run folder (not a timestamped sub-run as add_hparams does)
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent('hparams')
    start = plugin_data_pb2.HParamsPluginData.FromString(content['_hparams_/session_start_info']).session_start_info
    assert start.hparams['lr'].number_value == pytest.approx(0.1)
    assert start.hparams['model/depth'].number_value == 4
    assert start.hparams['model/name'].string_value == 'mlp'
    assert start.hparams['tags'].string_value == '[a, b]'
    assert [d for d in os.listdir(tmp_path / 'r1' / 'tb') if os.path.isdir(tmp_path / 'r1' / 'tb' / d)] == []

    tensors = acc.Tags()['tensors']
    table = acc.Tensors('results/text_summary')[0]
    assert table.step == 3
    text = table.tensor_proto.string_val[0].decode()
    assert '| name | score |' in text and 'b\\|c' in text
    assert 'traces/algo/text_summary' in tensors

    images = acc.Tags()['images']
    assert {'samples', 'samples/pred', 'gray'} <= set(images)  # add_images: one grid per call
    image = acc.Images('samples')[0]
    assert (image.step, image.width, image.height) == (4, 12, 8)  # two 6x8 images side by side
    assert acc.Images('gray')[0].width == 7
    assert 'samples/mask_class_labels/text_summary' in tensors


@pytest.mark.xfail(logger_refuses_uploads_at_close(), reason=UPLOADS_AT_CLOSE_BUG, strict=True)
def test_uploads_event_files_at_flush_and_close(tmp_path):
    uploader = RecordingUploader()
    tb = TensorboardLogger(log_dir=str(tmp_path / '{run_name}' / 'tb'), flush_interval=2)
    logger = Logger([tb, uploader], run_name='r2')
    logger.log_metrics({'x': 1.0}, step=1)
    logger.batch_end()
    assert uploader.uploads == []  # batch 1: no flush yet
    logger.batch_end()  # batch 2: flush -> upload
    names = uploader.names()
    assert len(names) == 1 and names[0].startswith('r2/tensorboard/events.out.tfevents.')
    assert uploader.uploads[0][2] is True  # overwrite: the file grows and is re-uploaded
    logger.batch_end()
    logger.batch_end()  # nothing new logged: no upload
    assert len(uploader.uploads) == 1
    logger.log_metrics({'x': 2.0}, step=2)
    logger.close()
    assert len(uploader.uploads) == 2
    local = tmp_path / 'r2' / 'tb' / names[0].rsplit('/', 1)[1]
    assert uploader.objects[names[0]] == local.read_bytes()


def test_validates_at_construction(fake_rank):
    with pytest.raises(ValueError, match='flush_interval'):
        TensorboardLogger(flush_interval=0)
    with pytest.raises(ValueError, match='unknown placeholder'):
        TensorboardLogger(log_dir='{run}/tb')
    fake_rank(rank=1, world_size=2)
    with pytest.raises(ValueError, match='cannot tell ranks apart'):
        TensorboardLogger(log_dir='{run_name}/tb', ranks='all')
    TensorboardLogger(log_dir='{run_name}/tb/rank{rank}', remote_dir='{run_name}/tb/rank{rank}', ranks='all')


def test_bad_images_raise_at_the_call(tmp_path):
    tb = TensorboardLogger(log_dir=str(tmp_path / 'tb'))
    with Logger(tb, run_name='r3') as logger:
        with pytest.raises(ValueError, match='1, 3 or 4 channels'):
            logger.log_images(np.zeros((2, 5, 8, 8)))
        with pytest.raises(ValueError, match='values 0-255'):
            logger.log_images(np.full((3, 8, 8), -1, dtype=np.int32))


def test_image_variants_incl_bfloat16_and_float16(tmp_path):
    import torch

    tb = TensorboardLogger(log_dir=str(tmp_path / 'tb'))
    variants = [  # (images, channels_last): the layouts Composer's TensorBoard logger takes
        (torch.rand(4, 4), False),
        (torch.rand(2, 3, 4, 4), False),
        (torch.rand(2, 3, 4, 4, dtype=torch.bfloat16), False),
        (torch.rand(2, 3, 4, 4, dtype=torch.float16), False),
        (torch.rand(3, 4, 4), False),
        ([torch.rand(4, 4, 3)], True),
        (torch.rand(2, 4, 4, 3, dtype=torch.bfloat16), True),
        ([torch.rand(4, 4, 3, dtype=torch.bfloat16), torch.rand(4, 4, 3, dtype=torch.bfloat16)], True),
    ]
    with Logger(tb, run_name='r4') as logger:
        for index, (images, channels_last) in enumerate(variants):
            logger.log_images(images, name=f'tensor{index}', channels_last=channels_last)
            as_numpy = [i.float().numpy() for i in images] if isinstance(images, list) else images.float().numpy()
            logger.log_images(as_numpy, name=f'np{index}', channels_last=channels_last)
    acc = _accumulator(tmp_path / 'tb')
    for index, (images, _) in enumerate(variants):
        count = len(images) if isinstance(images, list) else (images.shape[0] if images.dim() == 4 else 1)
        for prefix in ('tensor', 'np'):
            # add_images writes the batch as one grid of 4x4 images
            (event,) = acc.Images(f'{prefix}{index}')
            assert event.width * event.height >= count * 16 and event.encoded_image_string.startswith(b'\x89PNG')


def test_rank_zero_only_maps_onto_ranks(fake_rank):
    assert TensorboardLogger(rank_zero_only=True).ranks == 'zero'
    everywhere = TensorboardLogger(rank_zero_only=False)
    assert everywhere.ranks == 'all' and everywhere.log_dir_template == '{run_name}/tensorboard/rank{rank}'
    assert everywhere.remote_dir_template == '{run_name}/tensorboard/rank{rank}'
    assert TensorboardLogger(rank_zero_only=False, ranks='all').ranks == 'all'
    with pytest.raises(ValueError, match="rank_zero_only=True means ranks='zero'.*ranks='all'"):
        TensorboardLogger(rank_zero_only=True, ranks='all')
    with pytest.raises(TypeError, match='rank_zero_only must be a bool'):
        TensorboardLogger(rank_zero_only='yes')
    fake_rank(rank=1, world_size=2)
    TensorboardLogger(rank_zero_only=False)  # the per-rank default folders tell ranks apart
