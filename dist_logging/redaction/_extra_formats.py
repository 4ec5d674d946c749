"""Secret formats that gitleaks' default rules lack, as data, each with where its shape is documented.

Same layout as :mod:`dist_logging.redaction._gitleaks_formats` (id, Python regex, keywords, minimum entropy,
allow regexes). A regex with a ``secret`` group replaces only that group (the host and path of a
webhook URL stay readable); otherwise the whole match is the secret.
"""

SOURCE = {
    'name': 'dist_logging',
    'version': 'issue 23',
    'url': ('https://docs.github.com/en/code-security/secret-scanning/introduction/supported-secret-scanning-patterns'),
}

_RIGHT = r'(?![A-Za-z0-9_\-])'

RULES = (
    # https://discord.com/developers/docs/resources/webhook ("Execute Webhook": /webhooks/{id}/{token});
    # GitHub secret scanning: discord_webhook... (partner pattern); token 68 url-safe characters.
    (
        'discord-webhook-url',
        r'(?i:discord(?:app)?\.com/api(?:/v\d+)?/webhooks/)\d{17,20}/(?P<secret>[A-Za-z0-9_\-]{60,80})',
        ('discord',),
        3.0,
        (),
    ),
    # Slack incoming webhooks https://api.slack.com/messaging/webhooks: T.../B.../<24-character secret>;
    # gitleaks' slack-webhook-url replaces the whole URL, this keeps the host and the workspace ids.
    (
        'slack-webhook-url-secret',
        r'hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9]+/[A-Za-z0-9]+/(?P<secret>[A-Za-z0-9]{20,})',
        ('hooks.slack.com',),
        0.0,
        (),
    ),
    # Microsoft Teams incoming webhooks (https://learn.microsoft.com/en-us/microsoftteams/platform/
    # webhooks-and-connectors/how-to/add-incoming-webhook): gitleaks' microsoft-teams-webhook has capture groups
    # around a repeated ``xxxx-``, so its first group (what would be replaced) is 5 characters of a UUID; this
    # replaces the whole path after ``webhookb2/`` (the ids, the 32-character secret, a trailing ``/V2...`` token).
    (
        'microsoft-teams-webhook-secret',
        r'https://[A-Za-z0-9\-]+\.webhook\.office\.com/webhookb2/'
        r'(?P<secret>[A-Za-z0-9]{8}-(?:[A-Za-z0-9]{4}-){3}[A-Za-z0-9]{12}@[A-Za-z0-9]{8}-(?:[A-Za-z0-9]{4}-){3}'
        r'[A-Za-z0-9]{12}/IncomingWebhook/[A-Za-z0-9]{32}/[A-Za-z0-9]{8}-(?:[A-Za-z0-9]{4}-){3}[A-Za-z0-9]{12}'
        r'(?:/[A-Za-z0-9_\-]+)?)',
        ('webhookb2',),
        0.0,
        (),
    ),
    # Azure Storage shared access signatures https://learn.microsoft.com/en-us/rest/api/storageservices/
    # create-service-sas: ``sig=`` carries a base64 HMAC-SHA256 (44 characters, URL-encoded); GitHub:
    # azure_storage_sas_token.
    (
        'azure-sas-signature',
        r'(?<=[?&;]sig=)(?P<secret>(?:[A-Za-z0-9+/]|%2[BbFf]|%3[Dd]){40,}(?:=|%3[Dd]){0,2})',
        ('sig=',),
        0.0,
        (),
    ),
    # Replicate API tokens https://replicate.com/docs/topics/security/api-tokens: ``r8_`` + 37.
    ('replicate-api-token', r'\br8_[A-Za-z0-9]{37}' + _RIGHT, ('r8_',), 3.0, ()),
    # Groq API keys (GitHub secret scanning: groq_api_key): ``gsk_`` + 52.
    ('groq-api-key', r'\bgsk_[A-Za-z0-9]{52}' + _RIGHT, ('gsk_',), 3.0, ()),
    # LangSmith API keys (GitHub secret scanning: langchain_api_key): lsv2_pt_/lsv2_sk_ + 32 hex _ 10 hex.
    ('langsmith-api-key', r'\blsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}' + _RIGHT, ('lsv2_',), 3.0, ()),
    # Neptune API tokens: base64 of ``{"api_address":...,"api_url":...,"api_key":...}``.
    (
        'neptune-api-token',
        r'\beyJhcGlfYWRkcmVzcyI6[A-Za-z0-9+/]{40,}={0,2}' + _RIGHT,
        ('eyjhcglfywrkcmvzcyi6',),
        3.0,
        (),
    ),
    # Hugging Face user access tokens (https://huggingface.co/docs/hub/security-tokens): ``hf_`` + 34; gitleaks'
    # rule takes letters only, but tokens hold digits too. Widened where a credential is near-certain:
    # ``hf_`` at a word start + 30 or more letters and digits, at least one a digit (an Objective-C name
    # such as ``hf_requiredCharacteristicTypes...``, in gitleaks' false positives, has none).
    (
        'huggingface-access-token-alnum',
        r'(?<![A-Za-z0-9_])hf_(?=[A-Za-z]*[0-9])[A-Za-z0-9]{30,}' + _RIGHT,
        ('hf_',),
        2.0,
        (),
    ),
    # Google OAuth access tokens (GitHub secret scanning: google_oauth_access_token): ``ya29.`` + ...
    ('google-oauth-access-token', r'\bya29\.[0-9A-Za-z_\-]{30,}' + _RIGHT, ('ya29.',), 3.0, ()),
    # OpenAI-compatible model APIs (OpenAI legacy and project keys without gitleaks' exact lengths,
    # DeepSeek, Moonshot, DashScope ...): ``sk-`` + 32 or more letters and digits with a digit; ``sk-``
    # + 40 or more letters alone with two capitals in a row three times (a random key without a digit,
    # about one 48-character key in 1,400; camel-case names rarely put two capitals together); and
    # ``sk-proj-``/``sk-svcacct-``/``sk-admin-`` + 40 or more; never ``sk-ant-`` (Anthropic's own
    # rule is exact) and never hyphenated words (``sk-learn-compatible-...``).
    (
        'openai-compatible-api-key',
        r'\bsk-(?!ant-)(?:(?=[A-Za-z]*[0-9])[A-Za-z0-9]{32,}|(?=(?:[A-Za-z]*?[A-Z]{2}){3})[A-Za-z]{40,}'
        r'|(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{40,})' + _RIGHT,
        ('sk-',),
        3.0,
        (),
    ),
)
