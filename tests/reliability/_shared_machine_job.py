"""One user's job on a shared machine, run as that user by test_shared_machine.py.

``python _shared_machine_job.py '<json>'`` with ``{"home": ..., "steps": [...]}``; each step is an
upload (``files`` files of ``size`` bytes under the run ``run``, then wait and shut down) or a
download (``object`` to ``dest``), with an optional ``staging`` (``upload_staging_folder=``).
A step's exception is recorded, not raised, so one launch checks several things. The last line
printed is the JSON report: step name -> ``{"ok": ..., "error": ..., ...}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys


def _sha256(path: str) -> str:
    with open(path, 'rb') as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _upload(step: dict, home: str) -> dict:
    from dist_logging.destinations.remote import RemoteUploaderDownloader
    from dist_logging.state import State

    rud = RemoteUploaderDownloader(step['bucket'], upload_staging_folder=step.get('staging'))
    try:
        for index in range(step['files']):
            path = os.path.join(home, f"{step['name']}-{index}.bin")
            with open(path, 'wb') as handle:
                handle.write(os.urandom(step['size']))
            rud.upload_file(State(step['run']), f"{step['name']}/{index}.bin", path)
        landed = rud.wait_for_uploads(120)
        staging = rud.staging_dir
    finally:
        rud.shutdown()
    return {'ok': landed, 'staging_dir': staging}


def _download(step: dict) -> dict:
    from dist_logging.destinations.remote import RemoteUploaderDownloader
    from dist_logging.state import State

    rud = RemoteUploaderDownloader(step['bucket'], upload_staging_folder=step.get('staging'))
    try:
        if step.get('run'):
            rud.init(State(step['run']), None)  # a job's downloader knows its run (the marker names it)
        rud.download_file(step['object'], step['dest'], overwrite=step.get('overwrite', False), progress_bar=False)
    finally:
        rud.shutdown()
    return {'ok': True, 'sha256': _sha256(step['dest'])}


def main() -> None:
    config = json.loads(sys.argv[1])
    report = {'uid': os.getuid()}
    for step in config['steps']:
        try:
            report[step['name']] = _upload(step, config['home']) if step['do'] == 'upload' else _download(step)
        except Exception as exc:  # noqa: BLE001 - the test reads what each step ran into
            report[step['name']] = {'ok': False, 'error': f'{type(exc).__name__}: {exc}'}
    print(json.dumps(report))


if __name__ == '__main__':
    main()
