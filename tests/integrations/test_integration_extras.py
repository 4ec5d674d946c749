"""Each adapter module imports its framework lazily and names the extra to install when it is missing."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_missing_framework_names_the_extra(monkeypatch):
    from dist_logging.integrations._common import import_framework

    with pytest.raises(ImportError, match=r'pip install "dist-logging\[accelerate\]"'):
        import_framework(
            ('surely_not_installed_framework.tracking',), 'accelerate', 'dist_logging.integrations.accelerate'
        )


@pytest.mark.parametrize(
    'module, extra, blocked',
    [
        ('dist_logging.integrations.accelerate', 'accelerate', 'accelerate'),
        ('dist_logging.integrations.lightning', 'lightning', 'lightning'),
        ('dist_logging.integrations.transformers', 'transformers', 'transformers'),
    ],
)
def test_importing_an_adapter_without_its_framework_names_the_extra(monkeypatch, module, extra, blocked):
    for name in list(sys.modules):
        if name == module or name.split('.')[0] in (blocked, 'pytorch_lightning'):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, blocked, None)  # import of a None entry raises ImportError
    if blocked == 'lightning':
        monkeypatch.setitem(sys.modules, 'pytorch_lightning', None)
    with pytest.raises(ImportError, match=rf'pip install "dist-logging\[{extra}\]"'):
        importlib.import_module(module)
