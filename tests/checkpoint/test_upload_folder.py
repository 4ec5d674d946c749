"""Logger.upload_folder: a non-DCP checkpoint folder committed as one object and found by latest_checkpoint."""

from __future__ import annotations

import pytest

from dist_logging import Logger
from dist_logging.checkpoint import latest_checkpoint, list_checkpoints
from dist_logging.checkpoint._layout import MARKER_RE
from dist_logging.destinations import RemoteUploaderDownloader
from dist_logging.errors import UploadError
from _recording import RecordingStore

pytestmark = pytest.mark.timeout(60)


def hf_folder(path, tag: str):
    (path / 'sub').mkdir(parents=True)
    (path / 'config.json').write_text('{"tag": "%s"}' % tag)
    (path / 'model.safetensors').write_bytes(tag.encode() * 1000)
    (path / 'sub' / 'tokenizer.json').write_text(tag * 3)
    return path


def test_upload_folder_commits_after_every_file_and_uncommits_before_replacing(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'), block='model.safetensors')
    store.gate.set()
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'))
    logger = Logger(rud, run_name='r1')
    logger.upload_folder('{run_name}/hf/step10', hf_folder(tmp_path / 'a', 'a'))
    assert rud.wait_for_uploads(30)  # the uploads, then the folder's commit
    assert latest_checkpoint(store, 'r1/hf') == 'r1/hf/step10'

    store.gate.clear()  # the next version's big file stays in flight
    logger.upload_folder('r1/hf/step10', hf_folder(tmp_path / 'b', 'bb'))  # the same name: replaced
    assert latest_checkpoint(store, 'r1/hf') is None  # un-committed first: never old marker over new files
    store.gate.set()
    logger.close()  # waits for the uploads and the commit
    assert list_checkpoints(store, 'r1/hf') == ['r1/hf/step10']
    names = {info.name: info.size for info in store.list('r1/hf/step10/') if not MARKER_RE.match(info.name)}
    assert names == {
        'r1/hf/step10/config.json': len('{"tag": "bb"}'),
        'r1/hf/step10/model.safetensors': 2000,
        'r1/hf/step10/sub/tokenizer.json': 6,
    }
    uploads = [name for op, name in store.ops if op == 'upload']
    assert MARKER_RE.match(uploads[-1])  # the marker is the last write
    assert not (tmp_path / 'staging').exists() or not [  # .dist_logging-<host>: machine state (commit scratch)
        e for e in (tmp_path / 'staging').iterdir() if not e.name.startswith('.dist_logging-')
    ]


def test_upload_folder_failure_names_the_file_and_stays_invisible(tmp_path):
    store = RecordingStore(str(tmp_path / 'bucket'))
    store.fail = 'model.safetensors'
    rud = RemoteUploaderDownloader(object_store=store, upload_staging_folder=str(tmp_path / 'staging'), num_attempts=1)
    logger = Logger(rud, run_name='r1')
    raised = []
    try:  # a failure this fast may surface at the folder's own next hand-over, as any earlier failure does
        logger.upload_folder('r1/hf/step1', hf_folder(tmp_path / 'a', 'a'))
    except UploadError as exc:
        raised.append(exc)
    try:
        logger.close()
    except Exception as exc:  # noqa: BLE001 - the test checks what it names
        raised.append(exc)
    assert raised and any('r1/hf/step1/model.safetensors' in str(exc) for exc in raised)
    assert latest_checkpoint(store, 'r1/hf') is None
    with pytest.raises(NotADirectoryError):
        Logger(RemoteUploaderDownloader(str(tmp_path / 'b2'))).upload_folder('x', tmp_path / 'missing')
