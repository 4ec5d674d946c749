"""The checkpoint writer and reader say which torch they need instead of failing on a missing name."""

import pytest
import torch.distributed.checkpoint.filesystem as dcp_filesystem

import dist_logging.checkpoint as checkpoint


def test_a_torch_without_versioned_dcp_metadata_gets_a_clear_import_error(monkeypatch):
    monkeypatch.delattr(dcp_filesystem, 'CURRENT_DCP_VERSION')
    with pytest.raises(ImportError, match=r'need a newer torch .*lacks CURRENT_DCP_VERSION.*this is torch'):
        checkpoint.CheckpointWriter
    assert callable(checkpoint.latest_checkpoint)  # what needs no DCP still imports


def test_the_installed_torch_has_what_the_writer_needs():
    assert checkpoint.CheckpointWriter.__name__ == 'CheckpointWriter'
    assert checkpoint.CheckpointReader.__name__ == 'CheckpointReader'
