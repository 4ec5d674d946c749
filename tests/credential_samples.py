"""Freshly generated credentials in each service's real format (never a real credential; nothing here
is valid anywhere, and nothing real-looking is committed: every value is drawn with ``secrets`` when
the tests run, so secret scanners and push protection have nothing to flag in this file)."""

from __future__ import annotations

import base64
import secrets
import string

LOWER = string.ascii_lowercase
UPPER = string.ascii_uppercase
LETTERS = string.ascii_letters
DIGITS = string.digits
ALNUM = LETTERS + DIGITS
HEX = '0123456789abcdef'
URLSAFE = ALNUM + '_-'


def draw(alphabet: str, n: int) -> str:
    """``n`` characters drawn from ``alphabet``, with at least one digit when the alphabet has digits."""
    while True:
        value = ''.join(secrets.choice(alphabet) for _ in range(n))
        if n < 8 or not (set(alphabet) & set(DIGITS)) or any(c.isdigit() for c in value):
            return value


def samples() -> dict[str, str]:
    """One fresh credential per format: name -> value (the whole value is the secret)."""
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b'=').decode()
    claims = '{"sub":"%s","iat":1700000000}' % draw(DIGITS, 10)
    payload = base64.urlsafe_b64encode(claims.encode()).rstrip(b'=').decode()
    return {
        'aws_access_key_id': 'AKIA' + draw(UPPER + '234567', 16),
        'aws_temp_key_id': 'ASIA' + draw(UPPER + '234567', 16),
        'gcp_api_key': 'AIza' + draw(URLSAFE, 35),
        'google_oauth': 'ya29.' + draw(URLSAFE, 60),
        'azure_ad_client_secret': draw(ALNUM, 3) + draw(DIGITS, 1) + 'Q~' + draw(ALNUM + '_~.-', 34),
        'huggingface': 'hf_' + draw(LETTERS, 34),
        'huggingface_org': 'api_org_' + draw(LETTERS, 34),
        'openai_legacy': 'sk-' + draw(ALNUM, 20) + 'T3BlbkFJ' + draw(ALNUM, 20),
        'openai_project': 'sk-proj-' + draw(URLSAFE, 74) + 'T3BlbkFJ' + draw(URLSAFE, 74),
        'openai_compatible': 'sk-' + draw(HEX, 32),
        'anthropic': 'sk-ant-api03-' + draw(URLSAFE, 93) + 'AA',
        'perplexity': 'pplx-' + draw(ALNUM, 48),
        'replicate': 'r8_' + draw(ALNUM, 37),
        'groq': 'gsk_' + draw(ALNUM, 52),
        'langsmith': 'lsv2_pt_' + draw(HEX, 32) + '_' + draw(HEX, 10),
        'databricks': 'dapi' + draw(HEX, 32),
        'neptune': base64.b64encode(
            (
                '{"api_address":"https://app.neptune.ai","api_url":"https://app.neptune.ai",'
                '"api_key":"%s"}' % draw(HEX, 36)
            ).encode()
        )
        .decode()
        .rstrip('='),
        'github_pat': 'ghp_' + draw(ALNUM, 36),
        'github_oauth': 'gho_' + draw(ALNUM, 36),
        'github_app': 'ghs_' + draw(ALNUM, 36),
        'github_fine_grained': 'github_pat_' + draw(ALNUM + '_', 82),
        'gitlab_pat': 'glpat-' + draw(URLSAFE, 20),
        'npm': 'npm_' + draw(LOWER + DIGITS, 36),
        'pypi': 'pypi-AgEIcHlwaS5vcmc' + draw(URLSAFE, 70),
        'stripe_secret': 'sk_live_' + draw(ALNUM, 24),
        'stripe_restricted': 'rk_live_' + draw(ALNUM, 24),
        'slack_bot': 'xoxb-' + draw(DIGITS, 12) + '-' + draw(DIGITS, 13) + '-' + draw(ALNUM, 24),
        'slack_user': 'xoxp-' + '-'.join(draw(DIGITS, 12) for _ in range(3)) + '-' + draw(HEX, 32),
        'twilio': 'SK' + draw(HEX, 32),
        'sendgrid': 'SG.' + draw(URLSAFE, 22) + '.' + draw(URLSAFE, 43),
        'digitalocean': 'dop_v1_' + draw(HEX, 64),
        'jwt': f'{header}.{payload}.{draw(URLSAFE, 43)}',
    }


def webhook_urls() -> dict[str, tuple[str, str]]:
    """name -> (a URL carrying a secret, the secret part)."""
    slack = draw(ALNUM, 24)
    discord = draw(URLSAFE, 68)
    sig = draw(ALNUM + '%', 40).replace('%', '%2B') + '%3D'
    return {
        'slack_webhook': (
            f'https://hooks.slack.com/services/T{draw(UPPER + DIGITS, 10)}/B{draw(UPPER + DIGITS, 10)}/{slack}',
            slack,
        ),
        'discord_webhook': (f'https://discord.com/api/webhooks/{draw(DIGITS, 19)}/{discord}', discord),
        'azure_sas': (
            f'https://acct.blob.core.windows.net/ckpt/model.pt?sv=2022-11-02&ss=b&srt=o&sp=r'
            f'&se=2026-12-01T00:00:00Z&spr=https&sig={sig}',
            sig,
        ),
    }


def hex40() -> str:
    """A W&B API key's shape (40 hex characters): only its name or structure can tell it from a git SHA."""
    return draw(HEX, 40)
