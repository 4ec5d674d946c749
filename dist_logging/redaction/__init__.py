"""Redaction of secrets before any destination sees them.

Three rules, applied by the Logger to hyperparameters, traces and table cells:

* **By key name** (:func:`is_secret_key`): a key is split into words (on ``_ - .``, spaces,
  camelCase and digit boundaries) and names a credential when its words say so: password,
  passwd, pwd, passphrase, secret(s), credential(s), auth, cookie, an api/access/private/session/
  secret/client... ``key``, ``token`` standing alone or right after a word naming a service or
  authentication (``hf_token``, ``GITHUB_TOKEN``, ``access_token``), or ``token``/``key`` last after
  a service name or, in an environment-style name, after any non-vocabulary word (``KAGGLE_KEY``,
  ``MLFLOW_TRACKING_TOKEN``). ``token`` as a vocabulary or counted thing (``pad_token``,
  ``max_new_tokens``, ``tokenizer``) is not a credential, nor is a key naming where one is kept
  (``secretKeyRef``, ``hf_token_path``).
* **By key name and value**: a key ending in a credential word (``asanaToken``, ``codecov_token``,
  ``bittrex_key``) whose string value reads as a credential (length, character classes, entropy; not
  a special token such as ``<pad>``, a path, a name or a short number), in mappings, lists of
  flags, table columns and pairs inside strings: ``pad_token: "<pad>"`` stays.
* **By structure** (:class:`Redactor`): the item after a credential-named flag in a list
  (``['--wandb-api-key', X]``) and the ``value`` of a ``{name: <credential name>, value: X}`` mapping.
* **By value** (:func:`redact_text`), whatever the key, in every string: gitleaks' format rules
  (kept as data in :mod:`dist_logging.redaction._gitleaks_formats`, with its keywords, entropy
  floors and shape allowlists, never word allowlists) and a few of ours
  (:mod:`dist_logging.redaction._extra_formats`), a URL's user-info password, ``Authorization``
  header values, ``--user name:password``, PEM private-key blocks, and credential-named pairs inside
  a string, written the way configs, shells and code write them. A bare 40-hex string (a git
  commit), a UUID and a reference such as ``${DB_PASSWORD}`` are not secrets by their value.

Where each job lives: ``_keys`` (the key-name rule, keys decided by their value), ``_formats``
(compiling and gating the formats of ``_gitleaks_formats``, generated data, and ``_extra_formats``,
hand-kept data), ``_text`` (the value rule on one string: shapes, formats, pairs), ``_redactor``
(nested data), ``_common`` (what they share).
"""

from dist_logging.redaction._common import REDACTED
from dist_logging.redaction._formats import FORMAT_SOURCES
from dist_logging.redaction._keys import DEFAULT_SECRET_PATTERN, is_secret_key, key_words
from dist_logging.redaction._redactor import RedactOption, Redactor, build_redactor
from dist_logging.redaction._text import redact_text

__all__ = [
    'DEFAULT_SECRET_PATTERN',
    'FORMAT_SOURCES',
    'REDACTED',
    'RedactOption',
    'Redactor',
    'build_redactor',
    'is_secret_key',
    'key_words',
    'redact_text',
]
