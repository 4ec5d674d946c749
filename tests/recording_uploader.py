"""A fake upload-capable destination for tests: records each upload with the file's bytes at the call."""

from __future__ import annotations

import pathlib

from dist_logging.destination import LoggerDestination


class RecordingUploader(LoggerDestination):
    """Keeps ``uploads``: a list of ``(remote_name, bytes at the call, overwrite)``, and ``objects``: name -> newest
    bytes."""

    def __init__(self, ranks: str = 'all'):
        super().__init__(ranks=ranks)
        self.uploads: list[tuple[str, bytes, bool]] = []
        self.objects: dict[str, bytes] = {}

    def can_upload_files(self) -> bool:
        return True

    def upload_file(self, state, remote_file_name: str, file_path: pathlib.Path, *, overwrite: bool) -> None:
        data = pathlib.Path(file_path).read_bytes()
        if not overwrite and remote_file_name in self.objects:
            raise FileExistsError(remote_file_name)
        self.uploads.append((remote_file_name, data, overwrite))
        self.objects[remote_file_name] = data

    def names(self) -> list[str]:
        return [name for name, _, _ in self.uploads]


def logger_refuses_uploads_at_close() -> bool:
    """Whether ``Logger.close()`` refuses ``upload_file`` from a destination's ``close`` (a known Logger bug:
    it marks itself closed before the CLOSE event, so a FileLogger's last lines are not uploaded)."""
    import tempfile

    from dist_logging import Logger

    class UploadsAtClose(LoggerDestination):
        def close(self, state, logger):
            logger.upload_file('probe.txt', path, overwrite=True)

    with tempfile.NamedTemporaryFile() as handle:
        path = handle.name
        logger = Logger([UploadsAtClose(ranks='all'), RecordingUploader()], run_name='probe')
        try:
            logger.close()
        except RuntimeError:
            return True
    return False


UPLOADS_AT_CLOSE_BUG = (
    'Logger.close() marks the Logger closed before the CLOSE event, so upload_file from a destination\'s close() '
    'raises (dist_logging/logger.py)'
)
